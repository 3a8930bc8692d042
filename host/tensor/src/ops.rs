//! Operation names shared by the tensor layer and the backends.

/// Elementwise operations of two operands (tensor-tensor or tensor-scalar).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
}

impl BinaryOp {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) const ALL: [BinaryOp; 4] =
        [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div];

    /// Short name, also the stem of the CUDA kernel names.
    pub(crate) fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
        }
    }

    /// Name of the tensor-scalar form, for error messages.
    pub(crate) fn scalar_name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add_scalar",
            BinaryOp::Sub => "sub_scalar",
            BinaryOp::Mul => "mul_scalar",
            BinaryOp::Div => "div_scalar",
        }
    }
}

/// Elementwise operations of one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnaryOp {
    Neg,
    Relu,
    /// Floats only.
    Exp,
}

impl UnaryOp {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) const ALL: [UnaryOp; 3] = [UnaryOp::Neg, UnaryOp::Relu, UnaryOp::Exp];

    pub(crate) fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Relu => "relu",
            UnaryOp::Exp => "exp",
        }
    }

    pub(crate) fn float_only(self) -> bool {
        matches!(self, UnaryOp::Exp)
    }
}
