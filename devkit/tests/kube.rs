//! The test API server itself: it starts on ports of its own, serves the admin kubeconfig,
//! survives a kill of the API server (etcd keeps the objects) and leaves nothing behind.

use fleet_devkit::kube;

#[test]
fn the_api_server_starts_keeps_its_objects_across_a_kill_and_stops_with_its_value() {
    let Some(mut k) = kube::own_or_skip("the test API server's own test") else { return };
    let ns = k.namespace("smoke");
    k.kubectl_ok(&["-n", &ns, "create", "configmap", "kept", "--from-literal=a=b"]);
    k.kill_apiserver();
    assert!(!k.kubectl(&["get", "ns"]).status.success(), "the API server is down after the kill");
    k.start_apiserver().unwrap();
    let got = k.kubectl_ok(&["-n", &ns, "get", "configmap", "kept", "-o", "jsonpath={.data.a}"]);
    assert_eq!(got, "b", "etcd kept the object across the API server's restart");
    let url = k.url();
    drop(k);
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "nothing listens on {url} after the drop");
}
