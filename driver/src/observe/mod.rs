//! Following a job: its event stream (the driver's `Watch`), handed to observers.
//!
//! An [`Observer`] is what a job's events go to: the progress display on stderr
//! ([`console`]), TensorBoard event files ([`tensorboard`]), the Chrome trace of every rank's
//! steps ([`timeline`]), or one of your own. [`follow`] reads one stream of a job's events and
//! calls each observer's methods in the order the events come; [`Observers`] is a list of
//! observers that is itself one, so that one stream feeds them all.
//!
//! The trait is shaped like ripgrep's `Sink`: every method but [`Observer::finish`] has a
//! default that does nothing, so an observer implements only the events it needs.

pub mod console;
mod follow;
mod observer;
pub mod tensorboard;
pub mod timeline;

pub use follow::{FollowError, Followed, follow};
pub use observer::{Observer, Observers};
