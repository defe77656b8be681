//! A bucket as one flat device tensor: gradients written in bucket order, and the reduced flat
//! tensor cut back into gradients. Shared by the host-staged reduction (one copy each way) and the
//! NCCL reduction (no copy), so the bookkeeping the GPU runs is the one the CPU tests run.
//!
//! Each gradient starts at a multiple of [`SLOT_ALIGN_BYTES`], and a bucket of several ends on
//! one (zeros in between): burn's CUDA backend makes a slice a view of the bucket only when its
//! start and its distance to the bucket's end are multiples of its 512-byte memory alignment,
//! and copies it otherwise. So every gradient whose size is a multiple of 512 bytes (weight
//! matrices, most vectors of a wide model) is a view; an odd-sized one (a bias of 10) is still
//! copied, but no longer turns the gradients after it into copies. The padding is averaged
//! like the rest (zeros stay zeros) and never read back.

use super::reduction::{Held, Slot, first_slot};
use crate::error::DdpError;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, Shape, Slice, TensorMetadata};

/// Where gradients start in a flat bucket: the memory alignment of burn's CUDA backend (the
/// pitch `cuMemAllocPitch` uses), a multiple of every other backend's.
pub(crate) const SLOT_ALIGN_BYTES: usize = 512;

fn internal(what: String) -> DdpError {
    DdpError::Internal(format!("bucket reduction: {what}"))
}

/// The flat bucket of some slots: where each gradient starts, and the length, in elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FlatLayout {
    pub(crate) offsets: Vec<usize>,
    pub(crate) len: usize,
}

impl FlatLayout {
    /// Slot `i` starts at the first multiple of [`SLOT_ALIGN_BYTES`] after slot `i - 1`, and a
    /// bucket of several slots ends on one; a lone gradient is the bucket, unpadded. One dtype
    /// per bucket (buckets never mix dtypes).
    pub(crate) fn of<I: Backend>(slots: &[&Slot<I>]) -> FlatLayout {
        let elem = slots.first().map_or(1, |s| s.dtype.size().max(1));
        let align = (SLOT_ALIGN_BYTES / elem).max(1);
        let mut offsets = Vec::with_capacity(slots.len());
        let mut len = 0usize;
        for slot in slots {
            let start = len.next_multiple_of(align);
            offsets.push(start);
            len = start + slot.numel();
        }
        if slots.len() > 1 {
            len = len.next_multiple_of(align);
        }
        FlatLayout { offsets, len }
    }
}

/// Writes a bucket's gradients (one per slot, `None` for zeros: this rank did not use the
/// parameter, and every rank must reduce the same elements) into one 1-D tensor on the device,
/// laid out as [`FlatLayout::of`] says (returned with it). A lone gradient is the bucket itself
/// (no copy).
pub(crate) fn flatten<I: Backend>(
    slots: &[&Slot<I>],
    grads: Vec<Option<Held<I>>>,
) -> Result<(FloatTensor<I>, FlatLayout), DdpError> {
    let first = first_slot(slots)?;
    if grads.len() != slots.len() {
        return Err(internal(format!(
            "{} gradients for {} slots",
            grads.len(),
            slots.len()
        )));
    }
    let layout = FlatLayout::of(slots);
    let dtype = match first.dtype {
        DType::F32 => FloatDType::F32,
        DType::F64 => FloatDType::F64,
        DType::F16 => FloatDType::F16,
        DType::BF16 => FloatDType::BF16,
        other => {
            return Err(first.gradient_error(format!("DDP does not reduce {other:?} gradients")));
        }
    };
    let mut grads = grads.into_iter();
    if slots.len() == 1 {
        let flat = match grads.next().flatten() {
            Some(g) => I::float_reshape(device_tensor(g)?, Shape::new([layout.len])),
            None => I::float_zeros(Shape::new([layout.len]), &first.device, dtype),
        };
        return Ok((flat, layout));
    }
    // Zeros, then each gradient written in place (the fresh buffer is uniquely owned): one
    // fill and one copy per gradient, as a concatenation would cost.
    let mut flat = I::float_zeros(Shape::new([layout.len]), &first.device, dtype);
    for ((slot, g), &at) in slots.iter().zip(grads).zip(&layout.offsets) {
        let Some(g) = g else {
            continue;
        };
        let n = slot.numel();
        let g = device_tensor(g)?;
        // The fresh bucket has the slot's dtype, and writing into it does not convert.
        if g.dtype() != slot.dtype {
            return Err(slot.gradient_error(format!(
                "its gradient is {:?}, the parameter {:?}",
                g.dtype(),
                slot.dtype
            )));
        }
        let g = I::float_reshape(g, Shape::new([n]));
        let range = Slice::new(at as isize, Some((at + n) as isize), 1);
        flat = I::float_slice_assign(flat, &[range], g);
    }
    Ok((flat, layout))
}

fn device_tensor<I: Backend>(g: Held<I>) -> Result<FloatTensor<I>, DdpError> {
    match g {
        Held::Tensor(t) => Ok(t),
        Held::Host(_) => Err(internal(
            "a device bucket got a gradient in host memory".into(),
        )),
    }
}

/// Cuts a reduced flat bucket, laid out as `layout` ([`flatten`]'s), back into its gradients
/// (slices of it, in slot order, each in its parameter's shape).
pub(crate) fn unflatten<I: Backend>(
    bucket: FloatTensor<I>,
    layout: &FlatLayout,
    slots: &[&Slot<I>],
) -> Result<Vec<Option<FloatTensor<I>>>, DdpError> {
    let len = bucket.shape().num_elements();
    if layout.len != len {
        return Err(internal(format!(
            "the reduced bucket has {len} elements, its layout {}",
            layout.len
        )));
    }
    let mut tensors = Vec::with_capacity(slots.len());
    for (slot, &at) in slots.iter().zip(&layout.offsets) {
        let range = Slice::new(at as isize, Some((at + slot.numel()) as isize), 1);
        let piece = I::float_slice(bucket.clone(), &[range]);
        tensors.push(Some(I::float_reshape(
            piece,
            Shape::from(slot.shape.clone()),
        )));
    }
    Ok(tensors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;
    use burn::tensor::ops::FloatTensorOps;

    type B = burn::backend::Flex;

    fn slot(shape: &[usize], dtype: DType) -> Slot<B> {
        Slot {
            path: format!("p{shape:?}"),
            shape: shape.to_vec(),
            dtype,
            device: Default::default(),
            entries: vec![0],
        }
    }

    #[test]
    fn every_gradient_starts_on_a_512_byte_boundary() {
        let slots = [
            slot(&[10], DType::F32),
            slot(&[3, 5], DType::F32),
            slot(&[256], DType::F32),
        ];
        let refs: Vec<&Slot<B>> = slots.iter().collect();
        let layout = FlatLayout::of(&refs);
        assert_eq!(layout.offsets, vec![0, 128, 256]);
        assert_eq!(layout.len, 512, "ends on a boundary");
        let halves = [slot(&[3], DType::F16), slot(&[1], DType::F16)];
        let refs: Vec<&Slot<B>> = halves.iter().collect();
        let layout = FlatLayout::of(&refs);
        assert_eq!((layout.offsets, layout.len), (vec![0, 256], 512));
        let doubles = [slot(&[65], DType::F64), slot(&[2], DType::F64)];
        let refs: Vec<&Slot<B>> = doubles.iter().collect();
        let layout = FlatLayout::of(&refs);
        assert_eq!((layout.offsets, layout.len), (vec![0, 128], 192));
        let lone = [slot(&[7], DType::F32)];
        let refs: Vec<&Slot<B>> = lone.iter().collect();
        assert_eq!(
            FlatLayout::of(&refs).len,
            7,
            "a lone gradient has no padding"
        );
    }

    fn read(t: FloatTensor<B>) -> TensorData {
        burn::tensor::try_read_sync(<B as FloatTensorOps<B>>::float_into_data(t))
            .expect("a blocking read")
            .expect("read")
    }

    #[test]
    fn flatten_then_unflatten_gives_back_each_gradient_and_zeros_for_the_unused() {
        let slots = [
            slot(&[2, 3], DType::F32),
            slot(&[4], DType::F32),
            slot(&[5], DType::F32),
        ];
        let refs: Vec<&Slot<B>> = slots.iter().collect();
        let device = Default::default();
        let tensor = |v: Vec<f32>, shape: &[usize]| {
            <B as FloatTensorOps<B>>::float_from_data(TensorData::new(v, shape.to_vec()), &device)
        };
        let a: Vec<f32> = (1..=6).map(|x| x as f32).collect();
        let c: Vec<f32> = (10..15).map(|x| x as f32).collect();
        let grads = vec![
            Some(Held::Tensor(tensor(a.clone(), &[2, 3]))),
            None,
            Some(Held::Tensor(tensor(c.clone(), &[5]))),
        ];
        let (flat, layout) = flatten(&refs, grads).expect("flatten");
        assert_eq!(layout, FlatLayout::of(&refs));
        assert_eq!(layout.offsets, vec![0, 128, 256]);
        let host: Vec<f32> = read(flat.clone()).to_vec().expect("f32");
        assert_eq!(host.len(), layout.len);
        assert_eq!(&host[..6], &a[..]);
        assert!(
            host[6..256].iter().all(|&x| x == 0.0),
            "padding and the unused gradient are zeros"
        );
        assert_eq!(&host[256..261], &c[..]);
        assert!(host[261..].iter().all(|&x| x == 0.0), "tail padding");
        assert_eq!(layout.len, 384);
        let back = unflatten(flat, &layout, &refs).expect("unflatten");
        let shaped = |t: &Option<FloatTensor<B>>| -> (Vec<usize>, Vec<f32>) {
            let d = read(t.clone().expect("a tensor"));
            (d.shape.to_vec(), d.to_vec().expect("f32"))
        };
        assert_eq!(shaped(&back[0]), (vec![2, 3], a));
        assert_eq!(shaped(&back[1]), (vec![4], vec![0.0; 4]));
        assert_eq!(shaped(&back[2]), (vec![5], c));
        let short = tensor(vec![0.0; layout.len - 1], &[layout.len - 1]);
        assert!(unflatten(short, &layout, &refs).is_err());
    }
}
