//! Whether this thread is inside a backward that a DDP or FSDP wrapper runs. Taps fire on the
//! thread that called `backward()`, so a tap that reaches an idle wrapper while this is true
//! belongs to another wrapper's loss (two wrapped models in one graph, a GAN's generator loss
//! through the wrapped discriminator), not to a plain `loss.backward()`: the errors differ.

use std::cell::Cell;
use std::marker::PhantomData;

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Marks this thread as inside a wrapper's backward until dropped.
pub(crate) struct InWrapperBackward {
    /// Bound to the thread whose mark it holds.
    _not_send: PhantomData<*const ()>,
}

impl InWrapperBackward {
    pub(crate) fn enter() -> Self {
        DEPTH.with(|d| d.set(d.get() + 1));
        InWrapperBackward {
            _not_send: PhantomData,
        }
    }

    /// True while any wrapper's backward runs on this thread.
    pub(crate) fn active() -> bool {
        DEPTH.with(|d| d.get() > 0)
    }
}

impl Drop for InWrapperBackward {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

#[cfg(test)]
mod tests {
    use super::InWrapperBackward;

    #[test]
    fn the_mark_nests_and_ends_with_its_guards() {
        assert!(!InWrapperBackward::active());
        let outer = InWrapperBackward::enter();
        let inner = InWrapperBackward::enter();
        drop(inner);
        assert!(InWrapperBackward::active());
        drop(outer);
        assert!(!InWrapperBackward::active());
        let other = std::thread::spawn(|| {
            let _mark = InWrapperBackward::enter();
            InWrapperBackward::active()
        });
        assert!(other.join().unwrap_or(false));
        assert!(!InWrapperBackward::active());
    }
}
