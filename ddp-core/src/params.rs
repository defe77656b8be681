//! The model's parameters as DDP sees them: a flat, ordered list built by visiting the module.
//!
//! Visiting forces lazy initialisation (burn's layers create their tensors on first use, and a
//! clone of an uninitialised module would draw new values). Float parameters that require
//! gradients are *trainable*: they get taps and buckets. Other float state (batch-norm running
//! statistics, frozen weights) is a *buffer*: DDP copies it from rank 0.

use burn::module::{ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use std::any::Any;
use std::sync::Arc;

use crate::tap::{TapBackend, TapScope};

/// Rebuilds a parameter's gradient tensor from host data and registers it.
pub(crate) type Unpack = Arc<dyn Fn(&mut GradientsParams, Vec<f32>) + Send + Sync + 'static>;
/// Registers a gradient that is still a tensor (a boxed float primitive of the inner backend);
/// used when there is nothing to reduce (world size 1).
pub(crate) type RegisterTensor =
    Arc<dyn Fn(&mut GradientsParams, Box<dyn Any>) + Send + Sync + 'static>;

/// One float parameter of the model.
pub(crate) struct ParamInfo {
    pub(crate) id: ParamId,
    /// Module path, e.g. `layers.1.weight`.
    pub(crate) path: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) trainable: bool,
    pub(crate) unpack: Unpack,
    pub(crate) register: RegisterTensor,
}

impl ParamInfo {
    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The line every rank compares at construction.
    pub(crate) fn signature(&self) -> String {
        format!(
            "{}\t{:?}\t{:?}\t{}",
            self.path,
            self.shape,
            self.dtype,
            if self.trainable { "param" } else { "buffer" }
        )
    }
}

impl std::fmt::Debug for ParamInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.signature())
    }
}

/// Visits every float parameter in module order, forcing initialisation.
pub(crate) struct Describe<B: AutodiffBackend> {
    path: Vec<String>,
    pub(crate) params: Vec<ParamInfo>,
    _backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> Describe<B> {
    pub(crate) fn new() -> Self {
        Describe {
            path: Vec::new(),
            params: Vec::new(),
            _backend: std::marker::PhantomData,
        }
    }
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Describe<B> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val(); // initialises a lazy parameter
        let shape = value.dims().to_vec();
        let dtype = value.dtype();
        let device = value.device();
        let id = param.id;
        let unpack_shape = shape.clone();
        let unpack: Unpack = Arc::new(move |grads: &mut GradientsParams, data: Vec<f32>| {
            let mut data = TensorData::new(data, unpack_shape.clone());
            if dtype != DType::F32 {
                data = data.convert_dtype(dtype);
            }
            grads.register::<B::InnerBackend, D>(id, Tensor::from_data(data, &device));
        });
        let register: RegisterTensor =
            Arc::new(move |grads: &mut GradientsParams, grad: Box<dyn Any>| {
                if let Ok(p) = grad.downcast::<burn::tensor::ops::FloatTensor<B::InnerBackend>>() {
                    grads.register::<B::InnerBackend, D>(
                        id,
                        Tensor::from_primitive(TensorPrimitive::Float(*p)),
                    );
                }
            });
        self.params.push(ParamInfo {
            id,
            path: self.path.join("."),
            shape,
            dtype,
            trainable: value.is_require_grad(),
            unpack,
            register,
        });
    }
}

/// Inserts a tap on every trainable parameter (visit order = parameter index).
pub(crate) struct TapMapper<B: TapBackend> {
    next: usize,
    trainable: Arc<Vec<bool>>,
    scope: Arc<TapScope<B::InnerBackend>>,
}

impl<B: TapBackend> TapMapper<B> {
    pub(crate) fn new(trainable: Arc<Vec<bool>>, scope: Arc<TapScope<B::InnerBackend>>) -> Self {
        TapMapper {
            next: 0,
            trainable,
            scope,
        }
    }
}

impl<B: TapBackend> ModuleMapper<B> for TapMapper<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let index = self.next;
        self.next += 1;
        if !self.trainable.get(index).copied().unwrap_or(false) {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let tapped = B::tap(tensor.into_primitive().tensor(), index, &self.scope);
        Param::from_mapped_value(
            id,
            Tensor::from_primitive(TensorPrimitive::Float(tapped)),
            mapper,
        )
    }
}

/// Reads the buffers (non-trainable float state) into one flat host vector.
pub(crate) struct ReadBuffers {
    next: usize,
    trainable: Arc<Vec<bool>>,
    pub(crate) values: Vec<f32>,
}

impl ReadBuffers {
    pub(crate) fn new(trainable: Arc<Vec<bool>>) -> Self {
        ReadBuffers {
            next: 0,
            trainable,
            values: Vec::new(),
        }
    }
}

impl<B: Backend> ModuleVisitor<B> for ReadBuffers {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let index = self.next;
        self.next += 1;
        if self.trainable.get(index).copied().unwrap_or(true) {
            return;
        }
        let data = param.val().into_data().convert::<f32>();
        match data.as_slice::<f32>() {
            Ok(s) => self.values.extend_from_slice(s),
            Err(_) => self.values.extend(data.iter::<f32>()),
        }
    }
}

/// Writes values read by [`ReadBuffers`] (on rank 0) back into the buffers, in the same order.
pub(crate) struct WriteBuffers {
    next: usize,
    offset: usize,
    trainable: Arc<Vec<bool>>,
    values: Vec<f32>,
}

impl WriteBuffers {
    pub(crate) fn new(trainable: Arc<Vec<bool>>, values: Vec<f32>) -> Self {
        WriteBuffers {
            next: 0,
            offset: 0,
            trainable,
            values,
        }
    }
}

impl<B: Backend> ModuleMapper<B> for WriteBuffers {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let index = self.next;
        self.next += 1;
        if self.trainable.get(index).copied().unwrap_or(true) {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.shape();
        let n = shape.num_elements();
        let (device, dtype) = (tensor.device(), tensor.dtype());
        let slice = self.values[self.offset..self.offset + n].to_vec();
        self.offset += n;
        let data = TensorData::new(slice, shape).convert_dtype(dtype);
        Param::from_mapped_value(id, Tensor::from_data(data, &device), mapper)
    }
}
