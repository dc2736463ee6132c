// scale/grad_exchange.cpp: see grad_exchange.h.
#include "grad_exchange.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/autograd.h"
#include "scale/scale_backend.h"
#include "core/cuda_backend.h"
#include "core/error.h"
#include "core/ops.h"

namespace fg {
namespace {

// n f32 values from src[src_at ..] to dst[dst_at ..], on the tensors' device (in fusegrad's
// stream's order on CUDA).
void copy_values(const Tensor& dst, std::int64_t dst_at, const Tensor& src, std::int64_t src_at,
                 std::int64_t n) {
    if (n <= 0) return;
    float* d = dst.data<float>() + dst_at;
    const float* s = src.data<float>() + src_at;
    const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
    if (d == s) return;  // a gradient that is its bucket's view
    if (dst.is_cuda())
        cuda_backend("grad_exchange").copy_device_to_device(d, s, bytes);
    else
        std::memcpy(d, s, bytes);
}

// flat[0 .. n) = share * sums[0 .. n) in f32, where sums holds the exchange's f32 sums (then it
// is flat itself: scaled in place) or their bf16 rounding (widened and scaled into flat in the
// same pass). One pass over the values where a cast, a scale and a copy back would make three.
// The product is the same float multiplication on both devices, so every rank gets the same bits.
void average_into(const Tensor& flat, const Tensor& sums, std::int64_t n, float share) {
    if (n <= 0) return;
    float* out = flat.data<float>();
    if (flat.is_cuda()) {
        const kernels::ScalarType from = sums.dtype() == DType::f32 ? kernels::ScalarType::f32
                                                                    : kernels::ScalarType::bf16;
        cuda_backend("grad_exchange").widen_scale(sums.raw_data(), from, share, out, n);
        return;
    }
    if (sums.dtype() == DType::f32) {
        for (std::int64_t i = 0; i < n; ++i) out[i] = share * out[i];
    } else {
        std::vector<float> wide = sums.slice(0, n).to_vector<float>();
        for (std::int64_t i = 0; i < n; ++i) out[i] = share * wide[static_cast<std::size_t>(i)];
    }
}

// CPU ranks: the TCP group's calls, carried out in order by a thread of their own while the
// caller goes on (the backward of earlier layers).
class TcpCollectives final : public Collectives {
public:
    explicit TcpCollectives(TcpGroup& group) : group_(group), worker_([this] { run(); }) {}

    ~TcpCollectives() override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stopping_ = true;
            if (busy_ || !queue_.empty()) {
                // Destroyed mid-exchange (the trainer is failing): drop what is queued and
                // unblock the call in flight, rather than wait for ranks that may never answer.
                queue_.clear();
                group_.shutdown();
            }
        }
        work_.notify_all();
        worker_.join();
    }

    void all_reduce_sum(void* data, std::size_t n, DType type) override {
        FG_CHECK(type == DType::f32 || type == DType::bf16, "grad_exchange", "CPU ranks sum f32 "
                 "or bf16 values, not ", dtype_name(type));
        if (type == DType::bf16) {
            auto* d = static_cast<std::uint16_t*>(data);
            enqueue([this, d, n] { group_.all_reduce_sum_bf16(d, n); });
        } else {
            auto* d = static_cast<float*>(data);
            enqueue([this, d, n] { group_.all_reduce_sum(d, n); });
        }
    }
    void reduce_scatter_sum(const void* in, void* out, std::size_t n, DType type) override {
        if (type == DType::bf16) {
            const auto* i = static_cast<const std::uint16_t*>(in);
            auto* o = static_cast<std::uint16_t*>(out);
            enqueue([this, i, o, n] { group_.reduce_scatter_sum_bf16(i, o, n); });
        } else {
            const auto* i = static_cast<const float*>(in);
            auto* o = static_cast<float*>(out);
            enqueue([this, i, o, n] { group_.reduce_scatter_sum(i, o, n); });
        }
    }
    void all_gather(const float* in, float* out, std::size_t n) override {
        enqueue([this, in, out, n] { group_.all_gather(in, out, n); });
    }
    void wait() override {
        std::unique_lock<std::mutex> lock(mu_);
        idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
        if (error_) {
            std::exception_ptr e = error_;
            error_ = nullptr;
            std::rethrow_exception(e);
        }
    }
    void sum_on_host(double* values, std::size_t n) override {
        wait();
        group_.all_reduce_sum(values, n);
    }

private:
    void enqueue(std::function<void()> call) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            queue_.push_back(std::move(call));
        }
        work_.notify_one();
    }

    void run() {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            work_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stopping, nothing left
            std::function<void()> call = std::move(queue_.front());
            queue_.pop_front();
            busy_ = true;
            const bool skip = error_ != nullptr;  // after a failure the group is broken
            lock.unlock();
            std::exception_ptr failed;
            if (!skip) {
                try {
                    call();
                } catch (...) {
                    failed = std::current_exception();
                }
            }
            lock.lock();
            if (failed && !error_) error_ = failed;
            busy_ = false;
            idle_.notify_all();
        }
    }

    TcpGroup& group_;
    std::mutex mu_;
    std::condition_variable work_, idle_;
    std::deque<std::function<void()>> queue_;
    bool busy_ = false, stopping_ = false;
    std::exception_ptr error_;
    std::thread worker_;  // last: it starts once everything above exists
};

// CUDA ranks: NCCL on the communicator's stream; host sums over TCP.
class NcclCollectives final : public Collectives {
public:
    NcclCollectives(void* communicator, TcpGroup& group, double timeout_s)
        : comm_(communicator), group_(group), timeout_s_(timeout_s) {}
    void all_reduce_sum(void* data, std::size_t n, DType type) override {
        scale().nccl_all_reduce_sum(comm_, data, n, scalar(type));
    }
    void reduce_scatter_sum(const void* in, void* out, std::size_t n, DType type) override {
        scale().nccl_reduce_scatter_sum(comm_, in, out, n, scalar(type));
    }
    void all_gather(const float* in, float* out, std::size_t n) override {
        scale().nccl_all_gather(comm_, in, out, n, kernels::ScalarType::f32);
    }
    // The host waits here (bounded; NCCL's errors and the TCP connections checked): a rank that
    // stopped must not leave the others blocked in a later synchronisation with no deadline.
    void wait() override {
        scale().nccl_synchronize(comm_, timeout_s_, [this] { return group_.peers_lost(); });
    }
    void join() override { scale().nccl_join(comm_); }
    void sum_on_host(double* values, std::size_t n) override { group_.all_reduce_sum(values, n); }

private:
    static ScaleBackend& scale() { return scale_backend("grad_exchange"); }
    static kernels::ScalarType scalar(DType t) {
        if (t == DType::i32) return kernels::ScalarType::i32;
        return t == DType::bf16 ? kernels::ScalarType::bf16 : kernels::ScalarType::f32;
    }
    void* comm_;
    TcpGroup& group_;
    double timeout_s_;
};

}  // namespace

std::unique_ptr<Collectives> tcp_collectives(TcpGroup& group) {
    return std::make_unique<TcpCollectives>(group);
}

std::unique_ptr<Collectives> nccl_collectives(void* communicator, TcpGroup& group,
                                              double timeout_s) {
    return std::make_unique<NcclCollectives>(communicator, group, timeout_s);
}

GradientExchange::GradientExchange(std::vector<NamedParam> params, Collectives& comm, int rank,
                                   int world_size, bool zero, std::size_t bucket_bytes,
                                   DType wire)
    : params_(std::move(params)), comm_(comm), rank_(rank), world_(world_size), zero_(zero),
      wire_(wire) {
    FG_CHECK(!params_.empty(), "grad_exchange", "no parameters to exchange");
    FG_CHECK(wire_ == DType::f32 || wire_ == DType::bf16, "grad_exchange", "gradients travel as "
             "f32 or bf16, not ", dtype_name(wire_));
    device_ = params_[0].param->device();
    std::vector<std::int64_t> numels;
    for (const NamedParam& p : params_) {
        FG_CHECK(p.param->dtype() == DType::f32 && p.param->device() == device_, "grad_exchange",
                 "parameter '", p.name, "' is ", dtype_name(p.param->dtype()), " on ",
                 device_name(p.param->device()), ": the exchange takes f32 parameters on ",
                 device_name(device_));
        numels.push_back(p.param->numel());
    }
    layout_ = layout_buckets(plan_buckets(numels, sizeof(float), bucket_bytes), numels, world_);
    bucket_of_.assign(params_.size(), 0);
    for (std::size_t b = 0; b < layout_.size(); ++b) {
        for (int i : layout_[b].params) bucket_of_[static_cast<std::size_t>(i)] = b;
        // Zeros: the padding is never written, so it stays zero in every sum and gather.
        flat_.push_back(Tensor::zeros({layout_[b].padded}, DType::f32, device_));
        shard_offsets_.push_back(shard_numel_);
        shard_numel_ += layout_[b].shard;
    }
    pending_.assign(layout_.size(), 0);
    wire_flat_.resize(layout_.size());
    if (zero_) shard_sums_ = Tensor::zeros({shard_numel_}, wire_, device_);
}

GradientExchange::~GradientExchange() {
    for (NamedParam& p : params_) p.param->set_post_accumulate_grad_hook(nullptr);
}

std::size_t GradientExchange::bucket_bytes_max() const {
    std::size_t most = 0;
    for (const BucketLayout& l : layout_)
        most = std::max(most, static_cast<std::size_t>(l.numel) * sizeof(float));
    return most;
}

std::size_t GradientExchange::buffer_bytes() const {
    std::size_t bytes = 0;
    for (const Tensor& f : flat_) bytes += f.nbytes();
    if (wire_ == DType::bf16)  // the rounded copies, while they travel
        for (const Tensor& f : flat_) bytes += f.nbytes() / 2;
    if (shard_sums_.defined()) bytes += shard_sums_.nbytes();
    return bytes;
}

void GradientExchange::install_hooks() {
    // Set at every step: loading a checkpoint replaces the parameters' tensors, hooks and all.
    for (std::size_t i = 0; i < params_.size(); ++i)
        params_[i].param->set_post_accumulate_grad_hook([this, i] { on_gradient(i); });
}

void GradientExchange::attach_gradients() {
    NoGradGuard no_grad;
    install_hooks();
    attached_ = true;
    armed_ = false;  // a step cut short after arm() (a failed capture) leaves it armed
    started_ = 0;
    received_.assign(params_.size(), false);
    for (std::size_t b = 0; b < layout_.size(); ++b) {
        const BucketLayout& l = layout_[b];
        // The backward's first gradient overwrites the bucket's old values (set_grad_storage),
        // so nothing zeroes the buckets: a parameter that gets none fails finish(), and the
        // padding, never written, stays the zeros it was made with.
        for (std::size_t k = 0; k < l.params.size(); ++k) {
            Tensor& p = *params_[static_cast<std::size_t>(l.params[k])].param;
            p.set_grad_storage(
                flat_[b].slice(l.offsets[k], l.offsets[k] + p.numel()).reshape(p.shape()));
        }
    }
}

void GradientExchange::arm() {
    install_hooks();
    armed_ = true;
    started_ = started_early_ = 0;
    for (std::size_t b = 0; b < layout_.size(); ++b)
        pending_[b] = static_cast<int>(layout_[b].params.size());
}

void GradientExchange::on_gradient(std::size_t param) {
    if (attached_) received_[param] = true;
    if (!armed_) return;  // an earlier micro-batch: its gradients are not final
    const std::size_t b = bucket_of_[param];
    FG_ASSERT(pending_[b] > 0, "parameter '", params_[param].name,
              "' finished its gradient twice in one backward");
    --pending_[b];
    // Buckets start in order, so that every rank queues the same exchanges in the same order.
    while (started_ < layout_.size() && pending_[started_] == 0) {
        start(started_++);
        ++started_early_;
    }
}

void GradientExchange::start(std::size_t b) {
    NoGradGuard no_grad;
    const BucketLayout& l = layout_[b];
    for (std::size_t k = 0; k < l.params.size(); ++k) {
        const NamedParam& np = params_[static_cast<std::size_t>(l.params[k])];
        const Tensor g = np.param->grad();
        FG_CHECK(g.defined() && g.dtype() == DType::f32 && g.device() == device_, "train", "rank ",
                 rank_, ": parameter '", np.name, "' has no f32 gradient on ",
                 device_name(device_), " in this step: data-parallel training sums every "
                 "parameter's gradient over the ranks, so each must take part in the loss");
        // Nothing to copy where the gradient is its place in the bucket (attach_gradients).
        copy_values(flat_[b], l.offsets[k], g, 0, g.numel());
    }
    // What travels: the bucket, or its bf16 rounding (kept until finish(): the exchange reads it
    // on the side).
    if (wire_ == DType::bf16) wire_flat_[b] = cast(flat_[b], DType::bf16);
    const Tensor& sent = wire_ == DType::bf16 ? wire_flat_[b] : flat_[b];
    if (zero_) {
        const std::size_t at = static_cast<std::size_t>(shard_offsets_[b]) * dtype_size(wire_);
        comm_.reduce_scatter_sum(sent.raw_data(),
                                 static_cast<char*>(shard_sums_.raw_data()) + at,
                                 static_cast<std::size_t>(l.shard), wire_);
    } else {
        comm_.all_reduce_sum(sent.raw_data(), static_cast<std::size_t>(l.numel), wire_);
    }
}

void GradientExchange::finish(bool on_host) {
    NoGradGuard no_grad;
    if (attached_) {
        // The attached gradients all exist (with old values where no backward wrote): whether a
        // backward reached each one is in received_. The same on every rank, so every rank stops here, once the buckets the
        // backward started have been exchanged (they are queued on every rank alike).
        attached_ = false;
        for (std::size_t i = 0; i < params_.size(); ++i) {
            if (received_[i]) continue;
            armed_ = false;
            comm_.wait();
            fail("train", "rank ", rank_, ": parameter '", params_[i].name, "' got no gradient "
                 "in this step: data-parallel training sums every parameter's gradient over the "
                 "ranks, so each must take part in the loss");
        }
    }
    if (!armed_) started_ = 0;
    while (started_ < layout_.size()) start(started_++);
    armed_ = false;
    started_ = 0;
    if (on_host)
        comm_.wait();
    else
        comm_.join();
    const double share = 1.0 / static_cast<double>(world_);
    if (zero_) {
        shard_grads_ = scale(cast(shard_sums_, DType::f32), share);
        for (Tensor& w : wire_flat_) w = Tensor();
        // The whole gradients are spent: the buckets serve the weights' gather next.
        for (NamedParam& np : params_) np.param->zero_grad();
        return;
    }
    for (std::size_t b = 0; b < layout_.size(); ++b) {
        const BucketLayout& l = layout_[b];
        // Into the bucket, where the attached gradients are; into each gradient otherwise.
        average_into(flat_[b], wire_ == DType::bf16 ? wire_flat_[b] : flat_[b], l.numel,
                     static_cast<float>(share));
        wire_flat_[b] = Tensor();
        for (std::size_t k = 0; k < l.params.size(); ++k) {
            Tensor g = params_[static_cast<std::size_t>(l.params[k])].param->grad();
            copy_values(g, 0, flat_[b], l.offsets[k], g.numel());
        }
    }
}

GradNorm GradientExchange::grad_norm(double max_norm) {
    FG_CHECK(shard_grads_.defined(), "grad_exchange", "the gradients' norm under ZeRO-1 needs "
             "the exchanged gradients first (finish)");
    // This rank's sum of squares, then every rank's, added in rank order on the host.
    double squares = fg::grad_norm_of({shard_grads_}, 0.0).norm.item();
    squares *= squares;
    comm_.sum_on_host(&squares, 1);
    const double norm = std::sqrt(squares);
    const double coef = max_norm > 0.0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
    const DType type = device_ == Device::cuda ? DType::f32 : DType::f64;
    return GradNorm{Tensor::full({}, norm, type, device_), Tensor::full({}, coef, type, device_)};
}

void GradientExchange::gather_into_buckets(const std::vector<Tensor*>* values,
                                           const Tensor* mine) {
    NoGradGuard no_grad;
    for (std::size_t b = 0; b < layout_.size(); ++b) {
        const BucketLayout& l = layout_[b];
        const std::int64_t own = static_cast<std::int64_t>(rank_) * l.shard;
        if (mine) {
            copy_values(flat_[b], own, *mine, shard_offsets_[b], l.shard);
        } else {
            for (const ShardPiece& piece : shard_pieces(l, rank_))
                copy_values(flat_[b], own + piece.shard_offset,
                            *(*values)[static_cast<std::size_t>(piece.param)], piece.param_offset,
                            piece.count);
        }
        comm_.all_gather(flat_[b].data<float>() + own, flat_[b].data<float>(),
                         static_cast<std::size_t>(l.shard));
    }
    comm_.wait();
}

void GradientExchange::gather(const std::vector<Tensor*>& values) {
    FG_CHECK(values.size() == params_.size(), "grad_exchange", "gather: ", values.size(),
             " tensors for ", params_.size(), " parameters");
    gather_into_buckets(&values, nullptr);
    for (std::size_t b = 0; b < layout_.size(); ++b) {
        const BucketLayout& l = layout_[b];
        for (std::size_t k = 0; k < l.params.size(); ++k) {
            Tensor& t = *values[static_cast<std::size_t>(l.params[k])];
            copy_values(t, 0, flat_[b], l.offsets[k], t.numel());
        }
    }
}

std::vector<Tensor> GradientExchange::gather_on_host(const Tensor& mine, bool keep) {
    NoGradGuard no_grad;
    gather_into_buckets(nullptr, &mine);
    std::vector<Tensor> whole;
    if (!keep) return whole;
    whole.resize(params_.size());
    for (std::size_t b = 0; b < layout_.size(); ++b) {
        const BucketLayout& l = layout_[b];
        for (std::size_t k = 0; k < l.params.size(); ++k) {
            const Tensor& p = *params_[static_cast<std::size_t>(l.params[k])].param;
            const Tensor view = flat_[b].slice(l.offsets[k], l.offsets[k] + p.numel());
            // A copy of its own: the buckets are reused by the next gather.
            whole[static_cast<std::size_t>(l.params[k])] =
                (view.is_cuda() ? view.to(Device::cpu) : view.clone()).reshape(p.shape());
        }
    }
    return whole;
}

ShardedAdamW::ShardedAdamW(std::vector<NamedParam> params, const AdamWOptions& options,
                           GradientExchange& exchange)
    : Optimizer(std::move(params)), opt_(options), exchange_(exchange) {
    check_adamw_options(opt_);
    FG_CHECK(exchange_.zero(), "adamw", "ShardedAdamW needs an exchange with ZeRO-1 on");
    const Device device = params_[0].param->device();
    m_ = Tensor::zeros({exchange_.shard_numel()}, DType::f32, device);
    v_ = Tensor::zeros({exchange_.shard_numel()}, DType::f32, device);
    for (const NamedParam& np : params_) decay_.push_back(adamw_decays(*np.param));
    m_whole_.resize(params_.size());
    v_whole_.resize(params_.size());
}

void ShardedAdamW::step(double lr, const Tensor& grad_scale) {
    NoGradGuard no_grad;
    const Tensor& g = exchange_.shard_grads();
    FG_CHECK(g.defined(), "adamw", "ZeRO-1's update needs the exchanged gradients first");
    ++steps_;
    std::vector<kernels::AdamWTensor> pieces;
    for (std::size_t b = 0; b < exchange_.bucket_count(); ++b) {
        const std::int64_t base = exchange_.shard_offset(b);
        for (const ShardPiece& piece : shard_pieces(exchange_.bucket(b), exchange_.rank())) {
            const std::int64_t at = base + piece.shard_offset;
            const std::size_t i = static_cast<std::size_t>(piece.param);
            pieces.push_back({params_[i].param->data<float>() + piece.param_offset,
                              g.data<float>() + at, m_.data<float>() + at, v_.data<float>() + at,
                              piece.count, static_cast<bool>(decay_[i])});
        }
    }
    adamw_update(pieces, m_.device(), opt_, lr, steps_, grad_scale);
    exchange_.release_shard_grads();  // spent: not kept through the next backward
    std::vector<Tensor*> weights;
    for (NamedParam& np : params_) weights.push_back(np.param);
    exchange_.gather(weights);
}

std::vector<std::pair<std::string, Tensor*>> ShardedAdamW::named_state() {
    return adamw_named_state(params_, m_whole_, v_whole_);
}

void ShardedAdamW::gather_state() {
    const bool keep = exchange_.rank() == 0;
    m_whole_ = exchange_.gather_on_host(m_, keep);
    v_whole_ = exchange_.gather_on_host(v_, keep);
    m_whole_.resize(params_.size());  // undefined where not kept
    v_whole_.resize(params_.size());
    loading_ = false;
}

void ShardedAdamW::prepare_state_load() {
    for (std::size_t i = 0; i < params_.size(); ++i) {
        m_whole_[i] = Tensor::zeros(params_[i].param->shape(), DType::f32, Device::cpu);
        v_whole_[i] = Tensor::zeros(params_[i].param->shape(), DType::f32, Device::cpu);
    }
    loading_ = true;
}

void ShardedAdamW::shard_state() {
    NoGradGuard no_grad;
    if (loading_) {
        // This rank's pieces of the loaded moments, each moved to the device on its own.
        for (std::size_t b = 0; b < exchange_.bucket_count(); ++b) {
            const std::int64_t base = exchange_.shard_offset(b);
            for (const ShardPiece& piece : shard_pieces(exchange_.bucket(b), exchange_.rank())) {
                const std::size_t i = static_cast<std::size_t>(piece.param);
                for (auto [whole, mine] : {std::pair<Tensor*, Tensor*>{&m_whole_[i], &m_},
                                           std::pair<Tensor*, Tensor*>{&v_whole_[i], &v_}}) {
                    const Tensor part = whole->reshape({whole->numel()})
                                            .slice(piece.param_offset,
                                                   piece.param_offset + piece.count)
                                            .to(mine->device());
                    copy_values(*mine, base + piece.shard_offset, part, 0, piece.count);
                }
            }
        }
    }
    loading_ = false;
    for (Tensor& t : m_whole_) t = Tensor();
    for (Tensor& t : v_whole_) t = Tensor();
}

}  // namespace fg
