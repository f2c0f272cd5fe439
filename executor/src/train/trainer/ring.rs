//! [`Ring`]: the one place a trainer keeps its current collective.

use crate::collective::Collective;

/// The ring a trainer synchronises through: the one its task started with, until a recovery
/// replaces it with a re-formed one.
pub enum Ring<'a> {
    /// The ring the task was started with (owned by the worker).
    Started(&'a mut dyn Collective),
    /// The ring the driver re-formed after a loss or to add executors.
    Reformed(Box<dyn Collective>),
}

impl Ring<'_> {
    /// The current ring.
    pub fn get(&mut self) -> &mut dyn Collective {
        match self {
            Ring::Started(comm) => &mut **comm,
            Ring::Reformed(comm) => comm.as_mut(),
        }
    }
}
