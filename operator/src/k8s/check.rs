//! The mirror's start-up check (docs/behaviour.md#kubernetes-mirror): before it mirrors, and again
//! whenever the API server refuses it as a whole, the mirror makes sure that
//!
//! 1. the client has a configuration (in-cluster ServiceAccount, or `KUBECONFIG`);
//! 2. both CRDs are installed (a list of each);
//! 3. its credentials may do every verb it uses on both resources in the namespace
//!    (`SelfSubjectAccessReview`s, which any authenticated user may ask);
//! 4. the namespace exists — a real API server lists an absent namespace as empty, so a
//!    dry-run create of a probe object is what tells (`namespaces "x" not found`).
//!
//! A failure that is the cluster's answer is a [`CheckError::Misconfigured`], one sentence
//! that names the fix; a server that does not answer is [`CheckError::Unreachable`].

use super::crd::MANAGED_BY;
use super::kind::Kind;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::Client;
use serde_json::json;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error("{0}")]
    Misconfigured(String),
    #[error("{0}")]
    Unreachable(String),
}

/// The verbs the mirror uses on each resource, as the chart's Role grants them.
pub const VERBS: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];
/// And on each resource's status.
pub const STATUS_VERBS: &[&str] = &["patch"];

/// Whether an API error is the cluster's answer about the request (4xx other than 429) rather
/// than the server failing to answer.
pub fn is_answer(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429)
}

/// Runs the checks in order; the first that fails says why.
pub async fn check(client: &Client, namespace: &str) -> Result<(), CheckError> {
    for kind in Kind::ALL {
        crd_installed(client, namespace, kind).await?;
    }
    allowed(client, namespace).await?;
    namespace_exists(client, namespace).await
}

async fn crd_installed(client: &Client, namespace: &str, kind: Kind) -> Result<(), CheckError> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &kind.resource());
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(CheckError::Misconfigured(format!(
            "the {} CRD ({}.fleet.taimen.dev) is not installed in the cluster: apply the CRDs \
             (`kubectl apply --server-side -f crds/`, or `fleet-controller crds | kubectl apply --server-side -f -`)",
            kind.name(),
            kind.plural()
        ))),
        Err(kube::Error::Api(s)) if s.code == 401 => Err(CheckError::Misconfigured(format!(
            "the API server does not accept the controller's credentials (401 {}): check the ServiceAccount token or \
             the KUBECONFIG user",
            s.message
        ))),
        // A refused list is named with every other refused verb by the access review.
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
        Err(e) if is_answer(&e) => Err(CheckError::Misconfigured(format!("listing {}: {e}", kind.plural()))),
        Err(e) => Err(CheckError::Unreachable(format!("listing {}: {e}", kind.plural()))),
    }
}

/// Every verb the mirror uses, asked of the API server at once; the refused ones named together.
async fn allowed(client: &Client, namespace: &str) -> Result<(), CheckError> {
    let mut asks = Vec::new();
    for kind in Kind::ALL {
        for verb in VERBS {
            asks.push((kind.plural(), "", *verb));
        }
        for verb in STATUS_VERBS {
            asks.push((kind.plural(), "status", *verb));
        }
    }
    let answers = futures::future::join_all(asks.iter().map(|a| may(client, namespace, *a))).await;
    let mut refused = Vec::new();
    for (ask, answer) in asks.iter().zip(answers) {
        if !answer? {
            let resource = if ask.1.is_empty() { ask.0.to_string() } else { format!("{}/{}", ask.0, ask.1) };
            refused.push(format!("{} {resource}", ask.2));
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(CheckError::Misconfigured(format!(
        "the controller's ServiceAccount may not {} in namespace {namespace:?} (fleet.taimen.dev): grant them with a \
         Role bound to it — the chart's Role does with mirror.enabled=true",
        refused.join(", ")
    )))
}

async fn may(
    client: &Client,
    namespace: &str,
    (resource, subresource, verb): (&str, &str, &str),
) -> Result<bool, CheckError> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(super::crd::GROUP.into()),
                resource: Some(resource.into()),
                subresource: (!subresource.is_empty()).then(|| subresource.into()),
                verb: Some(verb.into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    match api.create(&PostParams::default(), &review).await {
        Ok(r) => Ok(r.status.is_some_and(|s| s.allowed)),
        Err(e) if is_answer(&e) => Err(CheckError::Misconfigured(format!("asking what the controller may do: {e}"))),
        Err(e) => Err(CheckError::Unreachable(format!("asking what the controller may do: {e}"))),
    }
}

/// The name of the dry-run probe object (never stored).
pub const PROBE: &str = "fleet-controller-start-up-check";

async fn namespace_exists(client: &Client, namespace: &str) -> Result<(), CheckError> {
    let kind = Kind::Node;
    let ar = kind.resource();
    let probe: DynamicObject = serde_json::from_value(json!({
        "apiVersion": ar.api_version, "kind": ar.kind,
        "metadata": {"name": PROBE, "labels": {MANAGED_BY.0: MANAGED_BY.1}},
        "spec": {"nodeId": PROBE},
    }))
    .expect("the probe is an object");
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    let pp = PostParams { dry_run: true, field_manager: Some(super::crd::FIELD_MANAGER.into()) };
    match api.create(&pp, &probe).await {
        Ok(_) => Ok(()),
        // A probe left behind by nothing still proves the namespace.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 && s.details.as_ref().is_some_and(|d| d.kind == "namespaces") => {
            Err(CheckError::Misconfigured(format!(
                "namespace {namespace:?} does not exist: create it (`kubectl create namespace {namespace}`) or set \
                 FLEET_KUBERNETES_NAMESPACE (the chart's mirror.namespace) to one that does"
            )))
        }
        Err(e) if is_answer(&e) => {
            Err(CheckError::Misconfigured(format!("a dry-run create of a FleetNode in {namespace:?} was refused: {e}")))
        }
        Err(e) => Err(CheckError::Unreachable(format!("a dry-run create in {namespace:?}: {e}"))),
    }
}
