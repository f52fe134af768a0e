//! The controller's environment for a devkit: the platform's addresses (CP, IAM, issuer,
//! tenant, JWKS) and the service-account credentials this devkit's IAM accepts, as the
//! `FLEET_*` variables a `fleet-controller serve` reads. Tests, the simulator and dev tooling
//! take it from here instead of spelling the seven variables out each.

use crate::Devkit;

impl Devkit {
    /// The platform's part of the controller's environment for this devkit: exactly
    /// `FLEET_CONTROL_PLANE_URL`, `FLEET_IAM_URL`, `FLEET_IAM_ISSUER`, `FLEET_IAM_TENANT`,
    /// `FLEET_JWKS_URL`, `FLEET_CLIENT_ID` and `FLEET_CLIENT_SECRET`, in that order. The
    /// credentials are the service account of [`crate::DevkitConfig`], the only one this
    /// devkit's IAM grants tokens to. Listen addresses, the data directory and tuning are the
    /// caller's to add.
    pub fn controller_env(&self) -> Vec<(&'static str, String)> {
        let c = &self.config;
        vec![
            ("FLEET_CONTROL_PLANE_URL", self.url.clone()),
            ("FLEET_IAM_URL", self.url.clone()),
            ("FLEET_IAM_ISSUER", self.issuer()),
            ("FLEET_IAM_TENANT", c.tenant.clone()),
            ("FLEET_JWKS_URL", self.jwks_url()),
            ("FLEET_CLIENT_ID", c.client_id.clone()),
            ("FLEET_CLIENT_SECRET", c.client_secret.clone()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use crate::{Devkit, DevkitConfig};
    use std::collections::HashMap;

    async fn devkit() -> Devkit {
        let config = DevkitConfig {
            tenant: "t-env".into(),
            client_id: "ctl-env".into(),
            client_secret: "s3cret-env".into(),
            ..Default::default()
        };
        Devkit::start(config, "127.0.0.1:0".parse().expect("an address")).await.expect("the devkit starts")
    }

    #[tokio::test]
    async fn the_environment_names_exactly_the_platform_variables_with_this_devkits_values() {
        let dk = devkit().await;
        let env = dk.controller_env();
        let names: Vec<&str> = env.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            names,
            [
                "FLEET_CONTROL_PLANE_URL",
                "FLEET_IAM_URL",
                "FLEET_IAM_ISSUER",
                "FLEET_IAM_TENANT",
                "FLEET_JWKS_URL",
                "FLEET_CLIENT_ID",
                "FLEET_CLIENT_SECRET"
            ]
        );
        let env: HashMap<&str, String> = env.into_iter().collect();
        assert_eq!(env["FLEET_CONTROL_PLANE_URL"], format!("http://{}", dk.addr));
        assert_eq!(env["FLEET_IAM_URL"], dk.url);
        assert_eq!(env["FLEET_IAM_ISSUER"], dk.issuer());
        assert_eq!(env["FLEET_IAM_TENANT"], "t-env");
        assert_eq!(env["FLEET_JWKS_URL"], format!("{}/.well-known/jwks.json", dk.url));
        assert_eq!(env["FLEET_CLIENT_ID"], "ctl-env");
        assert_eq!(env["FLEET_CLIENT_SECRET"], "s3cret-env");
    }

    /// The variables work: the credentials get a service token from the IAM they name, and
    /// the JWKS they name answers with the key admin tokens are signed with.
    #[tokio::test]
    async fn the_environment_reaches_this_devkits_iam_and_jwks() {
        let dk = devkit().await;
        let env: HashMap<&str, String> = dk.controller_env().into_iter().collect();
        let audience = dk.state.lock().controller_audiences[0].clone();
        let http = reqwest::Client::new();
        let token = http
            .post(format!("{}/oauth2/token", env["FLEET_IAM_URL"]))
            .form(&[
                ("grant_type", "client_credentials"),
                ("client_id", env["FLEET_CLIENT_ID"].as_str()),
                ("client_secret", env["FLEET_CLIENT_SECRET"].as_str()),
                ("audience", audience.as_str()),
            ])
            .send()
            .await
            .expect("IAM answers");
        assert_eq!(token.status(), 200, "{}", token.text().await.unwrap_or_default());
        let jwks: serde_json::Value =
            http.get(&env["FLEET_JWKS_URL"]).send().await.expect("the JWKS answers").json().await.expect("JSON");
        assert_eq!(jwks, dk.signer().jwks());
    }
}
