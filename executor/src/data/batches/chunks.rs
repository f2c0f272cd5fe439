//! The converted chunks of an epoch as the batcher's draws take them: the chunk being read, its
//! next unread row, and the next chunk in plan order once it is used up. Shared by the draws of
//! every [`RowLayout`](crate::data::converter::RowLayout).

use std::time::Duration;

use crate::data::read_ahead::ReadAhead;
use crate::data::rows::Rows;
use crate::error::Result;

/// How long the training thread waits for the next chunk before declaring the reader stuck.
pub const READ_DEADLINE: Duration = Duration::from_secs(600);

/// The chunks of an epoch's partitions, read row by row.
pub struct Chunks {
    source: ReadAhead,
    /// The chunk being read.
    pub current: Rows,
    /// Its next unread row.
    pub cursor: usize,
    /// Where the next unread row's values start in `current.features`, for rows of lengths of
    /// their own (token sequences); 0 with each new chunk.
    pub offset: usize,
    exhausted: bool,
}

impl Chunks {
    /// The chunks `source` reads, none taken yet.
    pub fn new(source: ReadAhead) -> Chunks {
        Chunks {
            source,
            current: Rows::default(),
            cursor: 0,
            offset: 0,
            exhausted: false,
        }
    }

    /// Makes `current` hold unread rows (handing the used chunk back to the reader); false
    /// when the stream has ended.
    pub fn ensure_rows(&mut self) -> Result<bool> {
        while self.cursor >= self.current.rows {
            if self.exhausted {
                return Ok(false);
            }
            match self.source.next_chunk(READ_DEADLINE)? {
                Some(rows) => {
                    let used = std::mem::replace(&mut self.current, rows);
                    self.source.recycle(used);
                    self.cursor = 0;
                    self.offset = 0;
                }
                None => {
                    self.exhausted = true;
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }
}
