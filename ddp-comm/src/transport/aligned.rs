//! Byte buffers aligned for every element type: the transports' working copies and scratch
//! space, which they reduce in place through typed views.

/// `words` resized to hold `len` bytes, as those bytes: `u64`-backed, so the view is 8-byte
/// aligned and typed views of it are aligned for every element type. The one place the
/// transports get such buffers (TCP's working copies, MPI's scratch input, flattened parts,
/// the shared-memory rank-order sum).
///
/// The bytes hold whatever the buffer held before (zeros where it grew): every caller
/// overwrites all `len` of them, and a reused buffer (a chunk of every all-reduce) is not
/// zeroed each time for nothing.
pub(crate) fn aligned_bytes(words: &mut Vec<u64>, len: usize) -> &mut [u8] {
    words.resize(len.div_ceil(8), 0);
    &mut bytemuck::cast_slice_mut::<u64, u8>(words)[..len]
}

/// [`aligned_bytes`] holding a copy of `bytes`, for reducing in place without touching them.
pub(crate) fn aligned_copy<'a>(words: &'a mut Vec<u64>, bytes: &[u8]) -> &'a mut [u8] {
    let copy = aligned_bytes(words, bytes.len());
    copy.copy_from_slice(bytes);
    copy
}
