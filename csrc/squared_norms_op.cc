// KerasAdaptSquaredNorms: fused sums of squares of many tensors.
//
// The gradient-noise-scale monitor needs |g|^2 of the whole gradient every
// step. Calling tf.reduce_sum(tf.square(g)) per variable launches two kernels
// per variable, materialises the squared tensor and accumulates in the input
// precision (float16 overflows at 65504). This op reads every tensor once,
// accumulates in double, and returns per-tensor and total sums in float32.
//
//   inputs:  tensors: N tensors, each float32, float16 or bfloat16, any shape
//            (empty tensors and scalars included; dtypes may be mixed)
//   outputs: per_tensor: float32 [N]   sum(x_i^2) for each input
//            total:      float32 []    sum over all inputs

#include <algorithm>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace keras_adapt {

using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

REGISTER_OP("KerasAdaptSquaredNorms")
    .Input("tensors: T")
    .Output("per_tensor: float")
    .Output("total: float")
    .Attr("T: list({float, half, bfloat16}) >= 1")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->num_inputs()));
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Sums of squares of N tensors, accumulated in double precision.
per_tensor: float32 vector with sum(x^2) of each input.
total: float32 scalar, the sum of per_tensor.
)doc");

namespace {

// Sum of squares of data[begin, end) in double, four independent
// accumulators so the compiler can vectorise and pipeline.
template <typename T>
double SumSquares(const T* data, int64_t begin, int64_t end) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t i = begin;
  for (; i + 4 <= end; i += 4) {
    const double x0 = static_cast<float>(data[i]);
    const double x1 = static_cast<float>(data[i + 1]);
    const double x2 = static_cast<float>(data[i + 2]);
    const double x3 = static_cast<float>(data[i + 3]);
    a0 += x0 * x0;
    a1 += x1 * x1;
    a2 += x2 * x2;
    a3 += x3 * x3;
  }
  for (; i < end; ++i) {
    const double x = static_cast<float>(data[i]);
    a0 += x * x;
  }
  return (a0 + a1) + (a2 + a3);
}

template <typename T>
double SumSquaresSharded(OpKernelContext* ctx, const Tensor& t) {
  const int64_t n = t.NumElements();
  if (n == 0) return 0.0;
  const T* data = t.flat<T>().data();
  // Small tensors are not worth a thread hop.
  constexpr int64_t kMinShard = 1 << 16;
  if (n < 2 * kMinShard) return SumSquares(data, 0, n);
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  const int64_t num_shards =
      std::min<int64_t>(n / kMinShard, 4 * std::max(1, workers->NumThreads()));
  const int64_t shard_size = (n + num_shards - 1) / num_shards;
  std::vector<double> partial(num_shards, 0.0);
  // Each shard writes its own slot; the final sum is in a fixed order, so the
  // result does not depend on thread scheduling.
  workers->ParallelFor(num_shards, shard_size * 4, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t b = s * shard_size;
      const int64_t e = std::min(n, b + shard_size);
      partial[s] = b < e ? SumSquares(data, b, e) : 0.0;
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

class SquaredNormsOp : public OpKernel {
 public:
  explicit SquaredNormsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const int num = ctx->num_inputs();
    Tensor* per_tensor = nullptr;
    Tensor* total = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num}), &per_tensor));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &total));
    auto out = per_tensor->flat<float>();
    double sum = 0.0;
    for (int i = 0; i < num; ++i) {
      const Tensor& t = ctx->input(i);
      double s = 0.0;
      switch (t.dtype()) {
        case tensorflow::DT_FLOAT:
          s = SumSquaresSharded<float>(ctx, t);
          break;
        case tensorflow::DT_HALF:
          s = SumSquaresSharded<Eigen::half>(ctx, t);
          break;
        case tensorflow::DT_BFLOAT16:
          s = SumSquaresSharded<Eigen::bfloat16>(ctx, t);
          break;
        default:
          ctx->CtxFailure(tensorflow::errors::InvalidArgument(
              "KerasAdaptSquaredNorms: input ", i, " has unsupported dtype ",
              tensorflow::DataTypeString(t.dtype()),
              "; expected float32, float16 or bfloat16"));
          return;
      }
      out(i) = static_cast<float>(s);
      sum += s;
    }
    total->scalar<float>()() = static_cast<float>(sum);
  }
};

REGISTER_KERNEL_BUILDER(Name("KerasAdaptSquaredNorms").Device(tensorflow::DEVICE_CPU),
                        SquaredNormsOp);

}  // namespace
}  // namespace keras_adapt
