// OpTable.cpp — which CKernel each ATen op is, and its traits: the op table and classify_op().
//
// Note [Op table]: rows are written grouped by kind (easy to review) and sorted by name at
// compile time into kOpTable, which classify_op() binary-searches: no dynamic initialisation, no
// order-of-initialisation hazard, ~9 string compares per lookup for ~470 rows. A row names either
// an overload ("aten::max.other") or a base op ("aten::max"); the overload row wins. The table
// covers every op the four test models record (MLP, CNN, resnet18, transformer with SGD and AdamW:
// forward, backward and optimizer; checked by ckernel_test against recorded traces) plus the
// common inference and training families around them.
//
// An op is classified by what it computes, not by when it runs: the optimizer's add_, mul_,
// addcmul_ and sqrt are POINTWISE_* like their forward twins (the node's phase says it is an
// optimizer step). OPTIMIZER_UPDATE is for the multi-tensor kernels (_foreach_*, _fused_*) that
// update a whole list of parameters in one launch. Every OPAQUE row says why no kind fits.
#include <algorithm>
#include <array>
#include <iterator>

#include "crucible/core/OpTable.h"

namespace crucible {
namespace {

constexpr OpTableEntry k(std::string_view name, CKernel kind, std::uint8_t traits = 0) {
  return {name, kind, {}, traits};
}
constexpr OpTableEntry opaque(std::string_view name, std::string_view reason,
                              std::uint8_t traits = 0) {
  return {name, CKernel::Opaque, reason, traits};
}
using namespace op_trait;

constexpr std::string_view kDataDependentShape =
    "output shape depends on the tensor's values, known only after the kernel ran on the device";
constexpr std::string_view kHostReadReason =
    "device-to-host read of a value that steers Python control flow: a synchronization point";
constexpr std::string_view kAttention =
    "attention (two GEMMs around a softmax) as one op: no single kind covers it, so it runs as "
    "recorded";
constexpr std::string_view kRecurrent =
    "a whole recurrent layer (a time loop of GEMMs and pointwise ops) as one op";
constexpr std::string_view kFactorization =
    "dense factorization or solve (LAPACK): iterative and pivoting, not a GEMM";
constexpr std::string_view kFft = "FFT: no kernel kind covers it";

constexpr OpTableEntry kByKind[] = {
    // GEMM: matrix products. linear/matmul/einsum usually decompose into mm/addmm/bmm before
    // the recorder sees them; they are here for callers that record at a higher level.
    k("aten::_addmm_activation", CKernel::Gemm),
    k("aten::addbmm", CKernel::Gemm),
    k("aten::addmm", CKernel::Gemm),
    k("aten::addmm_", CKernel::Gemm),
    k("aten::addmv", CKernel::Gemm),
    k("aten::baddbmm", CKernel::Gemm),
    k("aten::bmm", CKernel::Gemm),
    k("aten::dot", CKernel::Gemm),
    k("aten::einsum", CKernel::Gemm),
    k("aten::linear", CKernel::Gemm),
    k("aten::linear_backward", CKernel::Gemm),
    k("aten::matmul", CKernel::Gemm),
    k("aten::mm", CKernel::Gemm),
    k("aten::mv", CKernel::Gemm),
    k("aten::vdot", CKernel::Gemm),

    // CONV: convolutions, forward and backward, every backend's entry point.
    k("aten::_convolution", CKernel::Conv),
    k("aten::_slow_conv2d_backward", CKernel::Conv),
    k("aten::_slow_conv2d_forward", CKernel::Conv),
    k("aten::conv1d", CKernel::Conv),
    k("aten::conv2d", CKernel::Conv),
    k("aten::conv3d", CKernel::Conv),
    k("aten::conv_transpose1d", CKernel::Conv),
    k("aten::conv_transpose2d", CKernel::Conv),
    k("aten::conv_transpose3d", CKernel::Conv),
    k("aten::convolution", CKernel::Conv),
    k("aten::convolution_backward", CKernel::Conv),
    k("aten::convolution_overrideable", CKernel::Conv),
    k("aten::cudnn_convolution", CKernel::Conv),
    k("aten::cudnn_convolution_transpose", CKernel::Conv),
    k("aten::mkldnn_convolution", CKernel::Conv),
    k("aten::slow_conv3d_forward", CKernel::Conv),
    k("aten::slow_conv_dilated2d", CKernel::Conv),
    k("aten::slow_conv_transpose2d", CKernel::Conv),
    k("aten::thnn_conv2d", CKernel::Conv),

    // POINTWISE_UNARY: one tensor in, same-shape tensor out (scalar parameters allowed);
    // dtype casts are here too: a cast reads and writes every element once.
    k("aten::_to_copy", CKernel::PointwiseUnary),
    k("aten::abs", CKernel::PointwiseUnary),
    k("aten::abs_", CKernel::PointwiseUnary),
    k("aten::acos", CKernel::PointwiseUnary),
    k("aten::asin", CKernel::PointwiseUnary),
    k("aten::atan", CKernel::PointwiseUnary),
    k("aten::bitwise_not", CKernel::PointwiseUnary),
    k("aten::ceil", CKernel::PointwiseUnary),
    k("aten::clamp", CKernel::PointwiseUnary),
    k("aten::clamp_", CKernel::PointwiseUnary),
    k("aten::clamp_max", CKernel::PointwiseUnary),
    k("aten::clamp_max_", CKernel::PointwiseUnary),
    k("aten::clamp_min", CKernel::PointwiseUnary),
    k("aten::clamp_min_", CKernel::PointwiseUnary),
    k("aten::cos", CKernel::PointwiseUnary),
    k("aten::cosh", CKernel::PointwiseUnary),
    k("aten::elu", CKernel::PointwiseUnary),
    k("aten::elu_", CKernel::PointwiseUnary),
    k("aten::erf", CKernel::PointwiseUnary),
    k("aten::erfinv", CKernel::PointwiseUnary),
    k("aten::exp", CKernel::PointwiseUnary),
    k("aten::exp2", CKernel::PointwiseUnary),
    k("aten::exp_", CKernel::PointwiseUnary),
    k("aten::expm1", CKernel::PointwiseUnary),
    k("aten::floor", CKernel::PointwiseUnary),
    k("aten::frac", CKernel::PointwiseUnary),
    k("aten::gelu", CKernel::PointwiseUnary),
    k("aten::gelu_", CKernel::PointwiseUnary),
    k("aten::hardsigmoid", CKernel::PointwiseUnary),
    k("aten::hardsigmoid_", CKernel::PointwiseUnary),
    k("aten::hardswish", CKernel::PointwiseUnary),
    k("aten::hardswish_", CKernel::PointwiseUnary),
    k("aten::hardtanh", CKernel::PointwiseUnary),
    k("aten::hardtanh_", CKernel::PointwiseUnary),
    k("aten::isfinite", CKernel::PointwiseUnary),
    k("aten::isinf", CKernel::PointwiseUnary),
    k("aten::isnan", CKernel::PointwiseUnary),
    k("aten::leaky_relu", CKernel::PointwiseUnary),
    k("aten::leaky_relu_", CKernel::PointwiseUnary),
    k("aten::log", CKernel::PointwiseUnary),
    k("aten::log10", CKernel::PointwiseUnary),
    k("aten::log1p", CKernel::PointwiseUnary),
    k("aten::log2", CKernel::PointwiseUnary),
    k("aten::log_sigmoid_forward", CKernel::PointwiseUnary),
    k("aten::logical_not", CKernel::PointwiseUnary),
    k("aten::mish", CKernel::PointwiseUnary),
    k("aten::mish_", CKernel::PointwiseUnary),
    k("aten::nan_to_num", CKernel::PointwiseUnary),
    k("aten::neg", CKernel::PointwiseUnary),
    k("aten::neg_", CKernel::PointwiseUnary),
    k("aten::reciprocal", CKernel::PointwiseUnary),
    k("aten::reciprocal_", CKernel::PointwiseUnary),
    k("aten::relu", CKernel::PointwiseUnary),
    k("aten::relu6", CKernel::PointwiseUnary),
    k("aten::relu_", CKernel::PointwiseUnary),
    k("aten::round", CKernel::PointwiseUnary),
    k("aten::rsqrt", CKernel::PointwiseUnary),
    k("aten::rsqrt_", CKernel::PointwiseUnary),
    k("aten::selu", CKernel::PointwiseUnary),
    k("aten::sigmoid", CKernel::PointwiseUnary),
    k("aten::sigmoid_", CKernel::PointwiseUnary),
    k("aten::sign", CKernel::PointwiseUnary),
    k("aten::sign_", CKernel::PointwiseUnary),
    k("aten::sgn", CKernel::PointwiseUnary),
    k("aten::sgn_", CKernel::PointwiseUnary),
    k("aten::silu", CKernel::PointwiseUnary),
    k("aten::silu_", CKernel::PointwiseUnary),
    k("aten::sin", CKernel::PointwiseUnary),
    k("aten::sinh", CKernel::PointwiseUnary),
    k("aten::softplus", CKernel::PointwiseUnary),
    k("aten::sqrt", CKernel::PointwiseUnary),
    k("aten::sqrt_", CKernel::PointwiseUnary),
    k("aten::square", CKernel::PointwiseUnary),
    k("aten::tan", CKernel::PointwiseUnary),
    k("aten::tanh", CKernel::PointwiseUnary),
    k("aten::tanh_", CKernel::PointwiseUnary),
    k("aten::threshold", CKernel::PointwiseUnary),
    k("aten::threshold_", CKernel::PointwiseUnary),
    k("aten::to", CKernel::PointwiseUnary, kMayReturnInput),  // dtype/layout casts; "aten::to.device" below
    k("aten::tril", CKernel::PointwiseUnary),
    k("aten::triu", CKernel::PointwiseUnary),
    k("aten::trunc", CKernel::PointwiseUnary),
    k("aten::type_as", CKernel::PointwiseUnary, kMayReturnInput),

    // POINTWISE_BINARY: two or more same-shape (broadcast) operands, one output element each;
    // a scalar operand (add.Scalar, div.Scalar) still makes it the binary op it is. Activation
    // backwards combine the gradient with the saved input. In the optimizer phase the in-place
    // forms (add_, mul_, addcmul_, lerp_) are the update arithmetic, classified the same.
    k("aten::__and__", CKernel::PointwiseBinary),
    k("aten::__or__", CKernel::PointwiseBinary),
    k("aten::add", CKernel::PointwiseBinary),
    k("aten::add_", CKernel::PointwiseBinary),
    k("aten::addcdiv", CKernel::PointwiseBinary),
    k("aten::addcdiv_", CKernel::PointwiseBinary),
    k("aten::addcmul", CKernel::PointwiseBinary),
    k("aten::addcmul_", CKernel::PointwiseBinary),
    k("aten::atan2", CKernel::PointwiseBinary),
    k("aten::bitwise_and", CKernel::PointwiseBinary),
    k("aten::bitwise_or", CKernel::PointwiseBinary),
    k("aten::bitwise_xor", CKernel::PointwiseBinary),
    k("aten::copysign", CKernel::PointwiseBinary),
    k("aten::div", CKernel::PointwiseBinary),
    k("aten::div_", CKernel::PointwiseBinary),
    k("aten::elu_backward", CKernel::PointwiseBinary),
    k("aten::eq", CKernel::PointwiseBinary),
    k("aten::floor_divide", CKernel::PointwiseBinary),
    k("aten::fmod", CKernel::PointwiseBinary),
    k("aten::ge", CKernel::PointwiseBinary),
    k("aten::gelu_backward", CKernel::PointwiseBinary),
    k("aten::gt", CKernel::PointwiseBinary),
    k("aten::hardsigmoid_backward", CKernel::PointwiseBinary),
    k("aten::hardswish_backward", CKernel::PointwiseBinary),
    k("aten::hardtanh_backward", CKernel::PointwiseBinary),
    k("aten::hypot", CKernel::PointwiseBinary),
    k("aten::le", CKernel::PointwiseBinary),
    k("aten::leaky_relu_backward", CKernel::PointwiseBinary),
    k("aten::lerp", CKernel::PointwiseBinary),
    k("aten::lerp_", CKernel::PointwiseBinary),
    k("aten::log_sigmoid_backward", CKernel::PointwiseBinary),
    k("aten::logical_and", CKernel::PointwiseBinary),
    k("aten::logical_or", CKernel::PointwiseBinary),
    k("aten::logical_xor", CKernel::PointwiseBinary),
    k("aten::lt", CKernel::PointwiseBinary),
    k("aten::masked_fill", CKernel::PointwiseBinary),
    k("aten::masked_fill_", CKernel::PointwiseBinary),
    k("aten::max.other", CKernel::PointwiseBinary),
    k("aten::maximum", CKernel::PointwiseBinary),
    k("aten::min.other", CKernel::PointwiseBinary),
    k("aten::minimum", CKernel::PointwiseBinary),
    k("aten::mish_backward", CKernel::PointwiseBinary),
    k("aten::mul", CKernel::PointwiseBinary),
    k("aten::mul_", CKernel::PointwiseBinary),
    k("aten::native_dropout_backward", CKernel::PointwiseBinary),
    k("aten::ne", CKernel::PointwiseBinary),
    k("aten::pow", CKernel::PointwiseBinary),
    k("aten::pow_", CKernel::PointwiseBinary),
    k("aten::remainder", CKernel::PointwiseBinary),
    k("aten::rsub", CKernel::PointwiseBinary),
    k("aten::sigmoid_backward", CKernel::PointwiseBinary),
    k("aten::silu_backward", CKernel::PointwiseBinary),
    k("aten::softplus_backward", CKernel::PointwiseBinary),
    k("aten::sub", CKernel::PointwiseBinary),
    k("aten::sub_", CKernel::PointwiseBinary),
    k("aten::tanh_backward", CKernel::PointwiseBinary),
    k("aten::threshold_backward", CKernel::PointwiseBinary),
    k("aten::true_divide", CKernel::PointwiseBinary),
    k("aten::where", CKernel::PointwiseBinary),
    k("aten::xlogy", CKernel::PointwiseBinary),

    // REDUCE: fewer output elements than input elements (a reduction over dims); scans too.
    k("aten::_foreach_norm", CKernel::Reduce),
    k("aten::all", CKernel::Reduce),
    k("aten::amax", CKernel::Reduce),
    k("aten::amin", CKernel::Reduce),
    k("aten::aminmax", CKernel::Reduce),
    k("aten::any", CKernel::Reduce),
    k("aten::argmax", CKernel::Reduce),
    k("aten::argmin", CKernel::Reduce),
    k("aten::count_nonzero", CKernel::Reduce),
    k("aten::cummax", CKernel::Reduce),
    k("aten::cumprod", CKernel::Reduce),
    k("aten::cumsum", CKernel::Reduce),
    k("aten::linalg_vector_norm", CKernel::Reduce),
    k("aten::logsumexp", CKernel::Reduce),
    k("aten::max", CKernel::Reduce),  // max.dim, max(); max.other is POINTWISE_BINARY
    k("aten::mean", CKernel::Reduce),
    k("aten::min", CKernel::Reduce),  // min.dim, min(); min.other is POINTWISE_BINARY
    k("aten::nansum", CKernel::Reduce),
    k("aten::norm", CKernel::Reduce),
    k("aten::prod", CKernel::Reduce),
    k("aten::std", CKernel::Reduce),
    k("aten::std_mean", CKernel::Reduce),
    k("aten::sum", CKernel::Reduce),
    k("aten::var", CKernel::Reduce),
    k("aten::var_mean", CKernel::Reduce),

    // NORM: batch / layer / group / instance normalisation and their backwards.
    k("aten::_batch_norm_impl_index", CKernel::Norm),
    k("aten::_batch_norm_impl_index_backward", CKernel::Norm),
    k("aten::_native_batch_norm_legit", CKernel::Norm),
    k("aten::_native_batch_norm_legit_functional", CKernel::Norm),
    k("aten::_native_batch_norm_legit_no_training", CKernel::Norm),
    k("aten::batch_norm", CKernel::Norm),
    k("aten::batch_norm_backward_elemt", CKernel::Norm),
    k("aten::batch_norm_backward_reduce", CKernel::Norm),
    k("aten::batch_norm_elemt", CKernel::Norm),
    k("aten::batch_norm_gather_stats_with_counts", CKernel::Norm),
    k("aten::batch_norm_stats", CKernel::Norm),
    k("aten::cudnn_batch_norm", CKernel::Norm),
    k("aten::cudnn_batch_norm_backward", CKernel::Norm),
    k("aten::group_norm", CKernel::Norm),
    k("aten::instance_norm", CKernel::Norm),
    k("aten::layer_norm", CKernel::Norm),
    k("aten::miopen_batch_norm", CKernel::Norm),
    k("aten::miopen_batch_norm_backward", CKernel::Norm),
    k("aten::native_batch_norm", CKernel::Norm),
    k("aten::native_batch_norm_backward", CKernel::Norm),
    k("aten::native_group_norm", CKernel::Norm),
    k("aten::native_group_norm_backward", CKernel::Norm),
    k("aten::native_layer_norm", CKernel::Norm),
    k("aten::native_layer_norm_backward", CKernel::Norm),
    k("aten::rms_norm", CKernel::Norm),

    // SOFTMAX: softmax and log-softmax (a max, an exp-sum and a normalise over one dim).
    k("aten::_log_softmax", CKernel::Softmax),
    k("aten::_log_softmax_backward_data", CKernel::Softmax),
    k("aten::_masked_softmax", CKernel::Softmax),
    k("aten::_masked_softmax_backward", CKernel::Softmax),
    k("aten::_safe_softmax", CKernel::Softmax),   // softmax that gives 0 for a fully masked row
    k("aten::_softmax", CKernel::Softmax),
    k("aten::_softmax_backward_data", CKernel::Softmax),
    k("aten::log_softmax", CKernel::Softmax),
    k("aten::softmax", CKernel::Softmax),

    // EMBEDDING: indexed gathers and scatters (an index tensor picks rows).
    k("aten::_embedding_bag", CKernel::Embedding),
    k("aten::_embedding_bag_backward", CKernel::Embedding),
    k("aten::_index_put_impl_", CKernel::Embedding),
    k("aten::embedding", CKernel::Embedding),
    k("aten::embedding_backward", CKernel::Embedding),
    k("aten::embedding_dense_backward", CKernel::Embedding),
    k("aten::gather", CKernel::Embedding),
    k("aten::index", CKernel::Embedding),
    k("aten::index_add", CKernel::Embedding),
    k("aten::index_add_", CKernel::Embedding),
    k("aten::index_copy_", CKernel::Embedding),
    k("aten::index_put", CKernel::Embedding),
    k("aten::index_put_", CKernel::Embedding),
    k("aten::index_select", CKernel::Embedding),
    k("aten::index_select_backward", CKernel::Embedding),
    k("aten::scatter", CKernel::Embedding),
    k("aten::scatter_", CKernel::Embedding),
    k("aten::scatter_add", CKernel::Embedding),
    k("aten::scatter_add_", CKernel::Embedding),
    k("aten::scatter_reduce", CKernel::Embedding),
    k("aten::take", CKernel::Embedding),

    // VIEW: the output aliases the input's storage (new sizes/strides/offset, no bytes moved).
    k("aten::_reshape_alias", CKernel::View, kShapePreservingView),
    k("aten::_unsafe_view", CKernel::View, kShapePreservingView),
    k("aten::alias", CKernel::View, kShapePreservingView | kMayReturnInput),
    k("aten::as_strided", CKernel::View),
    k("aten::broadcast_tensors", CKernel::View),
    k("aten::chunk", CKernel::View),
    k("aten::detach", CKernel::View, kMayReturnInput),
    k("aten::detach_", CKernel::View),
    k("aten::diagonal", CKernel::View),
    k("aten::expand", CKernel::View, kShapePreservingView),
    k("aten::expand_as", CKernel::View),
    k("aten::lift_fresh", CKernel::View, kMayReturnInput),  // torch.tensor(...): returns its argument
    k("aten::movedim", CKernel::View),
    k("aten::narrow", CKernel::View),
    k("aten::permute", CKernel::View),
    k("aten::select", CKernel::View),
    k("aten::slice", CKernel::View),
    k("aten::split", CKernel::View),
    k("aten::split_with_sizes", CKernel::View),
    k("aten::squeeze", CKernel::View),
    k("aten::squeeze_", CKernel::View),
    k("aten::swapaxes", CKernel::View),
    k("aten::t", CKernel::View),
    k("aten::t_", CKernel::View),
    k("aten::transpose", CKernel::View),
    k("aten::transpose_", CKernel::View),
    k("aten::unbind", CKernel::View),
    k("aten::unflatten", CKernel::View),
    k("aten::unfold", CKernel::View),
    k("aten::unsqueeze", CKernel::View),
    k("aten::unsqueeze_", CKernel::View),
    k("aten::view", CKernel::View, kShapePreservingView),
    k("aten::view_as", CKernel::View),

    // DATA_MOVEMENT: bytes copied into a new layout or place, values unchanged.
    k("aten::cat", CKernel::DataMovement),
    k("aten::clone", CKernel::DataMovement, kCopy),
    k("aten::constant_pad_nd", CKernel::DataMovement),
    k("aten::contiguous", CKernel::DataMovement, kCopy | kMayReturnInput),
    k("aten::copy", CKernel::DataMovement),
    k("aten::copy_", CKernel::DataMovement),
    k("aten::select_backward", CKernel::DataMovement),   // zeros, the gradient copied into one index
    k("aten::slice_backward", CKernel::DataMovement),
    k("aten::expand_copy", CKernel::DataMovement),
    k("aten::flip", CKernel::DataMovement),
    k("aten::narrow_copy", CKernel::DataMovement),
    k("aten::permute_copy", CKernel::DataMovement),
    k("aten::reflection_pad1d", CKernel::DataMovement),
    k("aten::reflection_pad2d", CKernel::DataMovement),
    k("aten::repeat", CKernel::DataMovement),
    k("aten::repeat_interleave", CKernel::DataMovement),  // int repeats; .Tensor is OPAQUE
    k("aten::replication_pad2d", CKernel::DataMovement),
    k("aten::roll", CKernel::DataMovement),
    k("aten::stack", CKernel::DataMovement),
    k("aten::to.device", CKernel::DataMovement, kMayReturnInput),
    k("aten::transpose_copy", CKernel::DataMovement),
    k("aten::view_copy", CKernel::DataMovement),

    // RNG: draws from the generator (dropout masks, initialisers, sampling).
    k("aten::bernoulli", CKernel::Rng),
    k("aten::bernoulli_", CKernel::Rng),
    k("aten::dropout", CKernel::Rng),
    k("aten::exponential_", CKernel::Rng),
    k("aten::feature_dropout", CKernel::Rng),
    k("aten::multinomial", CKernel::Rng),
    k("aten::native_dropout", CKernel::Rng),
    k("aten::normal", CKernel::Rng),
    k("aten::normal_", CKernel::Rng),
    k("aten::rand", CKernel::Rng),
    k("aten::rand_like", CKernel::Rng),
    k("aten::randint", CKernel::Rng),
    k("aten::randint_like", CKernel::Rng),
    k("aten::randn", CKernel::Rng),
    k("aten::randn_like", CKernel::Rng),
    k("aten::random_", CKernel::Rng),
    k("aten::randperm", CKernel::Rng),
    k("aten::uniform_", CKernel::Rng),

    // OPTIMIZER_UPDATE: multi-tensor kernels over a list of parameters / states in one launch.
    k("aten::_foreach_abs", CKernel::OptimizerUpdate),
    k("aten::_foreach_add", CKernel::OptimizerUpdate),
    k("aten::_foreach_add_", CKernel::OptimizerUpdate),
    k("aten::_foreach_addcdiv", CKernel::OptimizerUpdate),
    k("aten::_foreach_addcdiv_", CKernel::OptimizerUpdate),
    k("aten::_foreach_addcmul", CKernel::OptimizerUpdate),
    k("aten::_foreach_addcmul_", CKernel::OptimizerUpdate),
    k("aten::_foreach_clamp_max_", CKernel::OptimizerUpdate),
    k("aten::_foreach_clamp_min_", CKernel::OptimizerUpdate),
    k("aten::_foreach_copy_", CKernel::OptimizerUpdate),
    k("aten::_foreach_div", CKernel::OptimizerUpdate),
    k("aten::_foreach_div_", CKernel::OptimizerUpdate),
    k("aten::_foreach_lerp_", CKernel::OptimizerUpdate),
    k("aten::_foreach_maximum_", CKernel::OptimizerUpdate),
    k("aten::_foreach_mul", CKernel::OptimizerUpdate),
    k("aten::_foreach_mul_", CKernel::OptimizerUpdate),
    k("aten::_foreach_neg", CKernel::OptimizerUpdate),
    k("aten::_foreach_neg_", CKernel::OptimizerUpdate),
    k("aten::_foreach_pow", CKernel::OptimizerUpdate),
    k("aten::_foreach_reciprocal_", CKernel::OptimizerUpdate),
    k("aten::_foreach_sign", CKernel::OptimizerUpdate),
    k("aten::_foreach_sqrt", CKernel::OptimizerUpdate),
    k("aten::_foreach_sqrt_", CKernel::OptimizerUpdate),
    k("aten::_foreach_sub", CKernel::OptimizerUpdate),
    k("aten::_foreach_sub_", CKernel::OptimizerUpdate),
    k("aten::_foreach_zero_", CKernel::OptimizerUpdate),
    k("aten::_fused_adam_", CKernel::OptimizerUpdate),
    k("aten::_fused_adamw_", CKernel::OptimizerUpdate),
    k("aten::_fused_sgd_", CKernel::OptimizerUpdate),

    // COLLECTIVE: communication between processes (none in single-process traces).
    k("_c10d_functional::all_gather_into_tensor", CKernel::Collective),
    k("_c10d_functional::all_reduce", CKernel::Collective),
    k("_c10d_functional::reduce_scatter_tensor", CKernel::Collective),
    k("_c10d_functional::wait_tensor", CKernel::Collective),
    k("c10d::_allgather_base_", CKernel::Collective),
    k("c10d::_reduce_scatter_base_", CKernel::Collective),
    k("c10d::allgather_", CKernel::Collective),
    k("c10d::allreduce_", CKernel::Collective),
    k("c10d::alltoall_", CKernel::Collective),
    k("c10d::barrier", CKernel::Collective),
    k("c10d::broadcast_", CKernel::Collective),
    k("c10d::reduce_scatter_", CKernel::Collective),
    k("c10d_functional::all_gather_into_tensor", CKernel::Collective),
    k("c10d_functional::all_reduce", CKernel::Collective),
    k("c10d_functional::reduce_scatter_tensor", CKernel::Collective),
    k("c10d_functional::wait_tensor", CKernel::Collective),

    // LOSS: losses and their backwards (a pointwise term reduced to a scalar or per-sample).
    k("aten::_ctc_loss", CKernel::Loss),
    k("aten::_ctc_loss_backward", CKernel::Loss),
    k("aten::binary_cross_entropy", CKernel::Loss),
    k("aten::binary_cross_entropy_backward", CKernel::Loss),
    k("aten::binary_cross_entropy_with_logits", CKernel::Loss),
    k("aten::cross_entropy_loss", CKernel::Loss),
    k("aten::huber_loss", CKernel::Loss),
    k("aten::huber_loss_backward", CKernel::Loss),
    k("aten::kl_div", CKernel::Loss),
    k("aten::l1_loss", CKernel::Loss),
    k("aten::mse_loss", CKernel::Loss),
    k("aten::mse_loss_backward", CKernel::Loss),
    k("aten::nll_loss", CKernel::Loss),
    k("aten::nll_loss2d_backward", CKernel::Loss),
    k("aten::nll_loss2d_forward", CKernel::Loss),
    k("aten::nll_loss_backward", CKernel::Loss),
    k("aten::nll_loss_forward", CKernel::Loss),
    k("aten::nll_loss_nd", CKernel::Loss),
    k("aten::smooth_l1_loss", CKernel::Loss),
    k("aten::smooth_l1_loss_backward", CKernel::Loss),
    k("aten::soft_margin_loss", CKernel::Loss),

    // POOLING: windowed max / average, forward and backward.
    k("aten::_adaptive_avg_pool2d", CKernel::Pooling),
    k("aten::_adaptive_avg_pool2d_backward", CKernel::Pooling),
    k("aten::_adaptive_avg_pool3d", CKernel::Pooling),
    k("aten::_adaptive_avg_pool3d_backward", CKernel::Pooling),
    k("aten::adaptive_avg_pool1d", CKernel::Pooling),
    k("aten::adaptive_avg_pool2d", CKernel::Pooling),
    k("aten::adaptive_avg_pool3d", CKernel::Pooling),
    k("aten::adaptive_max_pool2d", CKernel::Pooling),
    k("aten::adaptive_max_pool2d_backward", CKernel::Pooling),
    k("aten::avg_pool1d", CKernel::Pooling),
    k("aten::avg_pool2d", CKernel::Pooling),
    k("aten::avg_pool2d_backward", CKernel::Pooling),
    k("aten::avg_pool3d", CKernel::Pooling),
    k("aten::avg_pool3d_backward", CKernel::Pooling),
    k("aten::max_pool1d", CKernel::Pooling),
    k("aten::max_pool2d", CKernel::Pooling),
    k("aten::max_pool2d_with_indices", CKernel::Pooling),
    k("aten::max_pool2d_with_indices_backward", CKernel::Pooling),
    k("aten::max_pool3d", CKernel::Pooling),
    k("aten::max_pool3d_with_indices", CKernel::Pooling),
    k("aten::max_pool3d_with_indices_backward", CKernel::Pooling),
    k("aten::mkldnn_max_pool2d", CKernel::Pooling),

    // FACTORY: tensors made from scalars and shapes alone (no tensor data read).
    k("aten::arange", CKernel::Factory),
    k("aten::empty", CKernel::Factory),
    k("aten::empty_like", CKernel::Factory),
    k("aten::empty_strided", CKernel::Factory),
    k("aten::eye", CKernel::Factory),
    k("aten::fill", CKernel::Factory),
    k("aten::fill_", CKernel::Factory),
    k("aten::full", CKernel::Factory),
    k("aten::full_like", CKernel::Factory),
    k("aten::linspace", CKernel::Factory),
    k("aten::new_empty", CKernel::Factory),
    k("aten::new_empty_strided", CKernel::Factory),
    k("aten::new_full", CKernel::Factory),
    k("aten::new_ones", CKernel::Factory),
    k("aten::new_zeros", CKernel::Factory),
    k("aten::ones", CKernel::Factory),
    k("aten::ones_like", CKernel::Factory),
    k("aten::scalar_tensor", CKernel::Factory),
    k("aten::zero_", CKernel::Factory),
    k("aten::zeros", CKernel::Factory),
    k("aten::zeros_like", CKernel::Factory),

    // OPAQUE: run op by op, each for its reason.
    opaque("aten::_assert_async",
           "asserts on a device value and fails asynchronously: a side effect, not a value"),
    opaque("aten::_cudnn_rnn", kRecurrent),
    opaque("aten::_fft_c2c", kFft),
    opaque("aten::_fft_c2r", kFft),
    opaque("aten::_fft_r2c", kFft),
    opaque("aten::_linalg_solve_ex", kFactorization),
    opaque("aten::_linalg_svd", kFactorization),
    opaque("aten::_local_scalar_dense",
           "_local_scalar_dense (.item()): device-to-host read of a scalar, a synchronization "
           "point whose value Python uses (AdamW reads its step count this way)",
           kHostRead),
    opaque("aten::_native_multi_head_attention", kAttention),
    opaque("aten::_scaled_dot_product_attention", kAttention),
    opaque("aten::_scaled_dot_product_efficient_attention", kAttention),
    opaque("aten::_scaled_dot_product_flash_attention", kAttention),
    opaque("aten::_transformer_encoder_layer_fwd",
           "inference fast path: a whole encoder layer (attention, feed-forward GEMMs, layer "
           "norms) as one native op that the recording does not decompose"),
    opaque("aten::_unique2", kDataDependentShape),
    opaque("aten::allclose", kHostReadReason, kHostRead),
    opaque("aten::argsort", "sort: a data-dependent permutation, no kernel kind covers it"),
    opaque("aten::bincount", kDataDependentShape),
    opaque("aten::equal", kHostReadReason, kHostRead),
    opaque("aten::gru", kRecurrent),
    opaque("aten::is_nonzero", kHostReadReason, kHostRead),
    opaque("aten::item", kHostReadReason, kHostRead),
    opaque("aten::linalg_cholesky_ex", kFactorization),
    opaque("aten::linalg_eigh", kFactorization),
    opaque("aten::linalg_inv_ex", kFactorization),
    opaque("aten::linalg_qr", kFactorization),
    opaque("aten::lstm", kRecurrent),
    opaque("aten::masked_select", kDataDependentShape),
    opaque("aten::mkldnn_rnn_layer", kRecurrent),           // nn.LSTM's CPU kernel (torch 2.x)
    opaque("aten::mkldnn_rnn_layer_backward", kRecurrent),
    opaque("aten::nonzero", kDataDependentShape),
    opaque("aten::record_stream",
           "stream bookkeeping for the caching allocator: no data is computed or moved"),
    opaque("aten::repeat_interleave.Tensor", kDataDependentShape),
    opaque("aten::repeat_interleave.self_Tensor", kDataDependentShape),
    opaque("aten::resize_",
           "reallocates the tensor's storage in place: later shapes come from its arguments, "
           "not from a kernel, and aliases of the old storage are cut"),
    opaque("aten::rnn_tanh", kRecurrent),
    opaque("aten::scaled_dot_product_attention", kAttention),
    opaque("aten::set_", "rebinds a tensor to another storage: aliasing that no kernel computes"),
    opaque("aten::sort", "sort: a data-dependent permutation, no kernel kind covers it"),
    opaque("aten::topk", "top-k selection: a data-dependent permutation, no kernel kind covers it"),
    opaque("aten::unique_consecutive", kDataDependentShape),
    opaque("aten::unique_dim", kDataDependentShape),
};

// Rows in the table. A change here is a deliberate edit of the registry (see ckernel_test).
constexpr std::size_t kOpCount = 480;
static_assert(std::size(kByKind) == kOpCount, "update kOpCount with the rows you add or remove");

constexpr bool by_name(const OpTableEntry& a, const OpTableEntry& b) { return a.name < b.name; }

constexpr std::array<OpTableEntry, kOpCount> sorted_rows() {
  std::array<OpTableEntry, kOpCount> t{};
  std::copy(std::begin(kByKind), std::end(kByKind), t.begin());
  std::sort(t.begin(), t.end(), by_name);
  return t;
}

// Note [Op table]: sorted at compile time.
constexpr std::array<OpTableEntry, kOpCount> kOpTable = sorted_rows();

constexpr bool names_unique() {
  for (std::size_t i = 1; i < kOpTable.size(); ++i) {
    if (kOpTable[i - 1].name == kOpTable[i].name) return false;
  }
  return true;
}
static_assert(names_unique(), "an op name appears in two rows of the op table");

constexpr bool reasons_exactly_on_opaque() {
  for (const OpTableEntry& e : kOpTable) {
    if ((e.kind == CKernel::Opaque) == e.reason.empty()) return false;
    if (e.kind == CKernel::kCount || e.name.find("::") == std::string_view::npos) return false;
  }
  return true;
}
static_assert(reasons_exactly_on_opaque(),
              "every OPAQUE row needs a reason, no other row has one; names are qualified");

const OpTableEntry* find(std::string_view name) {
  const auto it =
      std::lower_bound(kOpTable.begin(), kOpTable.end(), name,
                       [](const OpTableEntry& e, std::string_view n) { return e.name < n; });
  return it != kOpTable.end() && it->name == name ? &*it : nullptr;
}

constexpr std::string_view kNotInTable = kNotInOpTable;

}  // namespace

std::span<const OpTableEntry> op_table() noexcept { return kOpTable; }

OpClass classify_op(std::string_view qualified_name) noexcept {
  const OpTableEntry* e = find(qualified_name);
  if (e == nullptr) {
    // "aten::add.Tensor" -> "aten::add": the overload is what follows the first '.' after "::".
    const std::size_t ns = qualified_name.rfind("::");
    const std::size_t dot = qualified_name.find('.', ns == std::string_view::npos ? 0 : ns + 2);
    if (dot != std::string_view::npos) e = find(qualified_name.substr(0, dot));
  }
  if (e == nullptr) return {CKernel::Opaque, kNotInTable, 0};
  return {e->kind, e->reason, e->traits};
}

std::string_view op_base_name(std::string_view op) noexcept {
  const auto colons = op.find("::");
  if (colons != std::string_view::npos) op.remove_prefix(colons + 2);
  const auto dot = op.find('.');
  return dot == std::string_view::npos ? op : op.substr(0, dot);
}

bool is_in_place_op(std::string_view qualified_name) noexcept {
  const std::string_view base = op_base_name(qualified_name);
  const bool dunder = base.size() > 4 && base.starts_with("__") && base.ends_with("__");
  return dunder ? base.starts_with("__i") : (!base.empty() && base.back() == '_');
}

bool is_elementwise_functional(std::string_view qualified_name) noexcept {
  const OpClass c = classify_op(qualified_name);
  if (!ckernel_info(c.kind).elementwise && (c.traits & kCopy) == 0) return false;
  return !is_in_place_op(qualified_name);
}

}  // namespace crucible
