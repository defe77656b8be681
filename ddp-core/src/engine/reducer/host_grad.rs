//! [`HostGrad`]: a gradient in host memory, in its parameter's own dtype.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, TensorData};
use ddp_comm::{Element, bf16, f16};

/// Reads float tensor `t` into host memory, blocking (on a GPU, until the device has produced
/// it): the one device read of the host reductions, of a gradient or of a whole bucket. The
/// error says why it failed, for the caller to name what it was reading.
pub(crate) fn read_to_host<I: Backend>(t: FloatTensor<I>) -> Result<TensorData, String> {
    match burn::tensor::try_read_sync(I::float_into_data(t)) {
        Some(Ok(data)) => Ok(data),
        Some(Err(e)) => Err(format!("{e:?}")),
        None => Err("this platform cannot block on the read".into()),
    }
}

/// A gradient read from the device into host memory, in the parameter's dtype: f64 models are
/// reduced in f64, half-precision models in half precision.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum HostGrad {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl HostGrad {
    /// Takes over the data's storage when it can (no copy on the CPU backend).
    pub(crate) fn from_data(data: TensorData) -> Result<HostGrad, String> {
        let dtype = data.dtype;
        let err = |e| format!("reading {dtype:?} gradient data: {e:?}");
        Ok(match dtype {
            DType::F32 => HostGrad::F32(data.into_vec().map_err(err)?),
            DType::F64 => HostGrad::F64(data.into_vec().map_err(err)?),
            DType::F16 => HostGrad::F16(data.into_vec().map_err(err)?),
            DType::BF16 => HostGrad::BF16(data.into_vec().map_err(err)?),
            other => return Err(format!("DDP cannot reduce {other:?} gradients")),
        })
    }

    /// `n` zeros of `dtype`; `None` for a dtype DDP does not reduce.
    pub(crate) fn zeros(dtype: DType, n: usize) -> Option<HostGrad> {
        Some(match dtype {
            DType::F32 => HostGrad::F32(vec![0.0; n]),
            DType::F64 => HostGrad::F64(vec![0.0; n]),
            DType::F16 => HostGrad::F16(vec![f16::ZERO; n]),
            DType::BF16 => HostGrad::BF16(vec![bf16::ZERO; n]),
            _ => return None,
        })
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            HostGrad::F32(v) => v.len(),
            HostGrad::F64(v) => v.len(),
            HostGrad::F16(v) => v.len(),
            HostGrad::BF16(v) => v.len(),
        }
    }

    /// Adds `other` element-wise (a tied parameter's second use, `no_sync` accumulation).
    pub(crate) fn add(&mut self, other: &HostGrad) -> Result<(), String> {
        fn add<T: Copy + std::ops::Add<Output = T>>(a: &mut [T], b: &[T]) {
            a.iter_mut().zip(b).for_each(|(x, y)| *x = *x + *y);
        }
        match (self, other) {
            (HostGrad::F32(a), HostGrad::F32(b)) if a.len() == b.len() => add(a, b),
            (HostGrad::F64(a), HostGrad::F64(b)) if a.len() == b.len() => add(a, b),
            (HostGrad::F16(a), HostGrad::F16(b)) if a.len() == b.len() => add(a, b),
            (HostGrad::BF16(a), HostGrad::BF16(b)) if a.len() == b.len() => add(a, b),
            (a, b) => {
                return Err(format!(
                    "cannot add a gradient of {} elements to one of {}",
                    b.len(),
                    a.len()
                ));
            }
        }
        Ok(())
    }
}

/// The element types a [`HostGrad`] can hold, for code generic over them.
pub(crate) trait HostElement: Element + burn::tensor::Element {
    fn unwrap(g: HostGrad) -> Option<Vec<Self>>;
}

macro_rules! host_element {
    ($t:ty, $variant:ident) => {
        impl HostElement for $t {
            fn unwrap(g: HostGrad) -> Option<Vec<Self>> {
                match g {
                    HostGrad::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

host_element!(f32, F32);
host_element!(f64, F64);
host_element!(f16, F16);
host_element!(bf16, BF16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f64_gradients_keep_their_precision() {
        let v = vec![1.0f64 + 1e-12, -3.0];
        let g = HostGrad::from_data(TensorData::new(v.clone(), [2])).expect("f64");
        assert_eq!(g, HostGrad::F64(v));
    }

    #[test]
    fn adding_mismatched_gradients_is_an_error() {
        let mut a = HostGrad::zeros(DType::F32, 3).expect("f32");
        assert!(a.add(&HostGrad::F32(vec![1.0; 2])).is_err());
        assert!(a.add(&HostGrad::F64(vec![1.0; 3])).is_err());
        a.add(&HostGrad::F32(vec![1.0, 2.0, 3.0]))
            .expect("same shape");
        assert_eq!(a, HostGrad::F32(vec![1.0, 2.0, 3.0]));
    }
}
