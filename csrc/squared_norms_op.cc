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

// Sum of squares of data[begin, end) for float16/bfloat16: converted to
// float, accumulated in double (these types are rare and never the hot path).
template <typename T>
double SumSquares(const T* data, int64_t begin, int64_t end) {
  double a0 = 0, a1 = 0;
  int64_t i = begin;
  for (; i + 2 <= end; i += 2) {
    const double x0 = static_cast<float>(data[i]);
    const double x1 = static_cast<float>(data[i + 1]);
    a0 += x0 * x0;
    a1 += x1 * x1;
  }
  if (i < end) {
    const double x = static_cast<float>(data[i]);
    a0 += x * x;
  }
  return a0 + a1;
}

// float32, the hot path. Products are summed in 16 independent float lanes
// (one AVX-512 register, two AVX registers) over short blocks -- each lane
// adds only 32 terms, so float rounding stays ~1e-7 relative -- and each
// block's sum is added in double. target_clones compiles AVX-512, AVX2, AVX and
// baseline versions and picks one at load time, so the library still runs on
// any x86-64 CPU that TensorFlow runs on.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KERAS_ADAPT_TARGET_CLONES __attribute__((target_clones("avx512f", "avx2", "avx", "default")))
#else
#define KERAS_ADAPT_TARGET_CLONES
#endif

KERAS_ADAPT_TARGET_CLONES
double SumSquaresFloat(const float* data, int64_t begin, int64_t end) {
  constexpr int kLanes = 16;
  constexpr int64_t kBlock = 32 * kLanes;
  double total = 0.0;
  int64_t i = begin;
  while (i < end) {
    const int64_t block_end = std::min(end, i + kBlock);
    float acc[kLanes] = {0};
    for (; i + kLanes <= block_end; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) acc[l] += data[i + l] * data[i + l];
    }
    double block = 0.0;
    for (int l = 0; l < kLanes; ++l) block += acc[l];
    for (; i < block_end; ++i) block += static_cast<double>(data[i]) * data[i];
    total += block;
  }
  return total;
}

template <>
double SumSquares<float>(const float* data, int64_t begin, int64_t end) {
  return SumSquaresFloat(data, begin, end);
}

// The work is cut into chunks of at most kChunk elements across *all* inputs,
// so a gradient made of many mid-sized tensors is spread over the CPU pool as
// well as one made of a few huge ones. Each chunk writes its own slot and the
// slots are added in a fixed order: the result never depends on scheduling.
constexpr int64_t kChunk = 1 << 15;

struct Chunk {
  int input;
  int64_t begin;
  int64_t end;
};

double ChunkSumSquares(const Tensor& t, const Chunk& c) {
  switch (t.dtype()) {
    case tensorflow::DT_FLOAT:
      return SumSquares(t.flat<float>().data(), c.begin, c.end);
    case tensorflow::DT_HALF:
      return SumSquares(t.flat<Eigen::half>().data(), c.begin, c.end);
    case tensorflow::DT_BFLOAT16:
      return SumSquares(t.flat<Eigen::bfloat16>().data(), c.begin, c.end);
    default:
      return 0.0;  // rejected in Compute before any chunk runs
  }
}

class SquaredNormsOp : public OpKernel {
 public:
  explicit SquaredNormsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const int num = ctx->num_inputs();
    std::vector<Chunk> chunks;
    for (int i = 0; i < num; ++i) {
      const Tensor& t = ctx->input(i);
      OP_REQUIRES(ctx,
                  t.dtype() == tensorflow::DT_FLOAT || t.dtype() == tensorflow::DT_HALF ||
                      t.dtype() == tensorflow::DT_BFLOAT16,
                  tensorflow::errors::InvalidArgument(
                      "KerasAdaptSquaredNorms: input ", i, " has unsupported dtype ",
                      tensorflow::DataTypeString(t.dtype()),
                      "; expected float32, float16 or bfloat16"));
      const int64_t n = t.NumElements();
      for (int64_t b = 0; b < n; b += kChunk) chunks.push_back({i, b, std::min(n, b + kChunk)});
    }
    Tensor* per_tensor = nullptr;
    Tensor* total = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num}), &per_tensor));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &total));

    const int64_t num_chunks = static_cast<int64_t>(chunks.size());
    std::vector<double> partial(num_chunks, 0.0);
    auto work = [&](int64_t first, int64_t last) {
      for (int64_t c = first; c < last; ++c) {
        partial[c] = ChunkSumSquares(ctx->input(chunks[c].input), chunks[c]);
      }
    };
    if (num_chunks > 1) {
      auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
      workers->ParallelFor(num_chunks, /*cost_per_unit=*/4 * kChunk, work);
    } else {
      work(0, num_chunks);
    }

    std::vector<double> sums(num, 0.0);
    for (int64_t c = 0; c < num_chunks; ++c) sums[chunks[c].input] += partial[c];
    auto out = per_tensor->flat<float>();
    double sum = 0.0;
    for (int i = 0; i < num; ++i) {
      out(i) = static_cast<float>(sums[i]);
      sum += sums[i];
    }
    total->scalar<float>()() = static_cast<float>(sum);
  }
};

REGISTER_KERNEL_BUILDER(Name("KerasAdaptSquaredNorms").Device(tensorflow::DEVICE_CPU),
                        SquaredNormsOp);

}  // namespace
}  // namespace keras_adapt
