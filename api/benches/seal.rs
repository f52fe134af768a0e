//! Sealing one PAT to a node's key: the controller does this 100,000 times while a
//! 10,000-node fleet comes up (docs/performance.md).

use criterion::{criterion_group, criterion_main, Criterion};
use fleet_api::seal;

fn sealing(c: &mut Criterion) {
    let (secret, public) = seal::generate_keypair();
    // A PAT's length: prefix, id and secret.
    let pat = b"pat_01JD8Q3V6Z0000000000000000.s3cr3t-0123456789abcdef0123456789abcdef";
    c.bench_function("seal one PAT", |b| b.iter(|| seal::seal(&public, pat)));
    let sealed = seal::seal(&public, pat);
    c.bench_function("open one PAT", |b| b.iter(|| seal::open(&secret, &sealed).unwrap()));
}

criterion_group!(benches, sealing);
criterion_main!(benches);
