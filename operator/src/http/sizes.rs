//! Measuring what a connection keeps: 10,000 nodes each keep a connection's task and, while
//! a request is held, its state. The listener's and the node path's tests hold those sizes.

/// The size of the future `f` returns, without making one.
pub fn output_size<A, F>(_: impl FnOnce(A) -> F) -> usize {
    std::mem::size_of::<F>()
}
