//! The recurrent gates ([`RecurrentOps`]) on the GPU.

use super::CudaStorage;
use crate::backend::recurrent::RecurrentOps;

impl RecurrentOps for CudaStorage {}
