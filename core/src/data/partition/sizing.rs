//! How large the record batches of a partition are, and how many of them the decoders hold
//! ready ahead of an executor's training loop.

/// Rows decoded per record batch, at most.
pub const READ_BATCH_ROWS: usize = 4096;

/// Bytes of converted rows (features and labels as `f32`) that one record batch is sized to
/// ([`read_batch_rows`]): small enough that Parquet's level, index and value buffers and the
/// converted chunk of one batch stay in a core's L2 cache between the decoding passes, large
/// enough that the per-batch costs stay small.
pub const READ_CHUNK_BYTES: u64 = 512 << 10;

/// Threads that decode an executor's partitions ahead of its training loop. Partition `i` of an
/// epoch goes to decoder `i % READ_DECODERS`, and the loop takes the partitions back in order,
/// so that the rows it sees do not depend on which decoder finished first.
pub const READ_DECODERS: usize = 2;

/// Bytes of converted rows (features and labels as `f32`) that the decoders may hold ready
/// ahead of the training loop, all together; each may always hold one chunk.
pub const READ_AHEAD_BYTES: u64 = 64 << 20;

/// The most chunks one decoder holds ready, whatever their size.
const MAX_DEPTH: u64 = 256;

/// Rows per record batch (and per converted chunk) for rows of `row_bytes` bytes once
/// converted: about [`READ_CHUNK_BYTES`] of them, at least 1 and at most [`READ_BATCH_ROWS`].
pub fn read_batch_rows(row_bytes: u64) -> usize {
    let rows = READ_CHUNK_BYTES / row_bytes.max(1);
    rows.clamp(1, READ_BATCH_ROWS as u64) as usize
}

/// Converted chunks of [`read_batch_rows`] rows of `row_bytes` bytes that each decoder may
/// hold ready: its share of [`READ_AHEAD_BYTES`], at least 1 and at most 256.
pub fn read_ahead_depth(row_bytes: u64) -> usize {
    let chunk = (read_batch_rows(row_bytes) as u64).saturating_mul(row_bytes.max(1));
    let depth = READ_AHEAD_BYTES / (READ_DECODERS as u64) / chunk;
    depth.clamp(1, MAX_DEPTH) as usize
}

/// The most converted chunks (of [`read_batch_rows`] rows) alive between the decoders and the
/// training loop: those held ready, the one each decoder is converting, and the one the loop
/// is cutting into batches.
pub fn read_ahead_chunks(row_bytes: u64) -> u64 {
    (READ_DECODERS * (read_ahead_depth(row_bytes) + 1) + 1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_sized_in_bytes_within_their_row_and_depth_bounds() {
        // MNIST: 784 pixels and a label, as f32.
        let mnist = 4 * 785;
        assert_eq!(read_batch_rows(mnist), 166);
        assert_eq!(read_ahead_depth(mnist), 64);
        assert_eq!(read_ahead_chunks(mnist), 2 * 65 + 1);
        // Narrow rows stop at READ_BATCH_ROWS; rows wider than a chunk come one at a time,
        // and each decoder holds at least one.
        assert_eq!(read_batch_rows(8), READ_BATCH_ROWS);
        assert_eq!(read_ahead_depth(8), 256);
        assert_eq!(read_batch_rows(u64::MAX), 1);
        assert_eq!(read_ahead_depth(u64::MAX), 1);
        assert_eq!(read_batch_rows(0), READ_BATCH_ROWS);
        // What one decoder holds ready stays within its share of READ_AHEAD_BYTES.
        for row in [8, 100, mnist, 4 * 257, 1 << 20, 1 << 30] {
            let ready = read_ahead_depth(row) as u64 * read_batch_rows(row) as u64 * row;
            let one_chunk = read_batch_rows(row) as u64 * row;
            assert!(
                ready <= (READ_AHEAD_BYTES / 2).max(one_chunk),
                "{row}: {ready}"
            );
        }
    }
}
