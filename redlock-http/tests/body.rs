//! [`Holding`]: a body releases what it holds when it ends, and is cut off at a loss
//! only with abort on loss.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use redlock_http::body::{Holding, Step};

/// Says when it was dropped (released).
struct Held(Arc<AtomicBool>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A held value, a loss the test decides, and whether it was released.
fn held() -> (Held, Arc<AtomicBool>, Arc<AtomicBool>) {
    let (released, lost) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    (Held(Arc::clone(&released)), lost, released)
}

fn loss(lost: &Arc<AtomicBool>) -> impl Future<Output = ()> + Send + 'static {
    let lost = Arc::clone(lost);
    poll_fn(move |_| {
        if lost.load(Ordering::SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
}

#[test]
fn releases_when_the_body_ends() {
    let (kept, lost, released) = held();
    let mut hold = Holding::new(Some(kept), Some(loss(&lost)));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(hold.step(&mut cx), Step::Poll));
    hold.release_at_end(&Poll::Ready(Some(Ok::<_, ()>(()))));
    assert!(!released.load(Ordering::SeqCst));
    hold.release_at_end(&Poll::<Option<Result<(), ()>>>::Ready(None));
    assert!(released.load(Ordering::SeqCst));
    assert!(hold.held().is_none());
}

#[test]
fn a_loss_cuts_the_body_off_only_with_abort_on_loss() {
    let mut cx = Context::from_waker(Waker::noop());
    let (kept, _, released) = held();
    let mut hold = Holding::new(Some(kept), None::<std::future::Pending<()>>);
    assert!(matches!(hold.step(&mut cx), Step::Poll));
    assert!(!released.load(Ordering::SeqCst));

    let (cut, lost, released) = held();
    let mut hold = Holding::new(Some(cut), Some(loss(&lost)));
    assert!(matches!(hold.step(&mut cx), Step::Poll));
    lost.store(true, Ordering::SeqCst);
    let Step::Lost(held) = hold.step(&mut cx) else {
        panic!("the loss did not end the body");
    };
    assert!(!released.load(Ordering::SeqCst));
    drop(held);
    assert!(released.load(Ordering::SeqCst));
    assert!(matches!(hold.step(&mut cx), Step::Ended));
    let lost = redlock_http::LockLost::new("res");
    assert!(lost.to_string().contains("`res`"), "{lost}");
}
