#include "allocator.h"

#include "driver.h"
#include "guard.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace saturn {

size_t size_class(size_t bytes) {
  if (bytes == 0) return 0;
  const size_t step = bytes < kSmallLimit ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

namespace {

// One block handed out: freed back to its device's cache by `release`.
struct Block {
  void* ptr;
  size_t size;  // the size class
  c10::DeviceIndex device;
};

void* system_alloc(c10::DeviceIndex index, size_t bytes, bool* oom) {
  if (is_gpu(index)) return reinterpret_cast<void*>(mem_alloc(index, bytes, oom));
  void* p = std::aligned_alloc(kAlignment, bytes);
  *oom = p == nullptr;
  return p;
}

void system_free(c10::DeviceIndex index, void* ptr) {
  if (is_gpu(index)) {
    mem_free(index, reinterpret_cast<CUdeviceptr>(ptr));
  } else {
    std::free(ptr);
  }
}

class DevicePool {
 public:
  explicit DevicePool(c10::DeviceIndex index) : index_(index) {}

  Block* allocate(size_t requested) {
    const size_t size = size_class(requested);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      ++c_.hits;
      return hand_out(p, size);
    }
    ++c_.misses;
    bool oom = false;
    void* p = system_alloc(index_, size, &oom);
    size_t released = 0;
    if (oom) {
      ++c_.retries;
      released = release_cached();
      p = system_alloc(index_, size, &oom);
    }
    if (oom) {
      ++c_.failures;
      size_t free_b = 0, total_b = 0;
      if (is_gpu(index_)) mem_info(index_, &free_b, &total_b);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "saturn:", static_cast<int>(index_),
                       " out of memory: tried to allocate ", size, " bytes (", requested,
                       " requested); released ", released,
                       " cached bytes and retried once; saturn holds ", c_.allocated,
                       " bytes allocated, ", c_.reserved, " reserved",
                       is_gpu(index_) ? "; the GPU has " + std::to_string(free_b) +
                                            " bytes free of " + std::to_string(total_b)
                                      : std::string());
    }
    c_.reserved += size;
    c_.peak_reserved = std::max(c_.peak_reserved, c_.reserved);
    return hand_out(p, size);
  }

  void release(Block* b) {
    std::lock_guard<std::mutex> lock(mu_);
    c_.allocated -= b->size;
    --c_.allocations;
    free_[b->size].push_back(b->ptr);
  }

  size_t empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    return release_cached();
  }

  Counters counters() {
    std::lock_guard<std::mutex> lock(mu_);
    return c_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    c_.peak_allocated = c_.allocated;
    c_.peak_reserved = c_.reserved;
  }

  void reset_accumulated() {
    std::lock_guard<std::mutex> lock(mu_);
    c_.hits = c_.misses = c_.retries = c_.failures = 0;
  }

 private:
  Block* hand_out(void* p, size_t size) {
    c_.allocated += size;
    ++c_.allocations;
    c_.peak_allocated = std::max(c_.peak_allocated, c_.allocated);
    return new Block{p, size, index_};
  }

  // Caller holds mu_. Work already queued may still use a cached block: wait first.
  size_t release_cached() {
    if (is_gpu(index_)) synchronize(index_);
    size_t released = 0;
    for (auto& [size, ptrs] : free_) {
      for (void* p : ptrs) system_free(index_, p);
      released += size * ptrs.size();
      ptrs.clear();
    }
    c_.reserved -= static_cast<int64_t>(released);
    return released;
  }

  const c10::DeviceIndex index_;
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  Counters c_;
};

DevicePool& pool(c10::DeviceIndex index) {
  check_index(index);
  static std::mutex mu;
  static std::vector<std::unique_ptr<DevicePool>> pools;
  std::lock_guard<std::mutex> lock(mu);
  if (pools.empty()) {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      pools.push_back(std::make_unique<DevicePool>(i));
    }
  }
  return *pools[index];
}

void delete_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  pool(b->device).release(b);
  delete b;
}

class SaturnAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const c10::DeviceIndex index = current_device();
    const c10::Device device(c10::DeviceType::PrivateUse1, index);
    if (n == 0) return c10::DataPtr(nullptr, nullptr, nullptr, device);
    Block* b = pool(index).allocate(n);
    return c10::DataPtr(b->ptr, b, &delete_block, device);
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    const c10::DeviceIndex index = current_device();
    if (is_gpu(index)) {
      copy_d2d(index, reinterpret_cast<CUdeviceptr>(dest), reinterpret_cast<CUdeviceptr>(src),
               count);
    } else {
      std::memcpy(dest, src, count);
    }
  }

  bool initialized() override { return true; }

  void emptyCache(c10::MempoolId_t) override {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) pool(i).empty_cache();
  }

  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // one stream per device

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex index) override {
    const Counters c = pool(index).counters();
    c10::CachingDeviceAllocator::DeviceStats s;
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    s.allocated_bytes[agg].current = c.allocated;
    s.allocated_bytes[agg].peak = c.peak_allocated;
    s.active_bytes[agg].current = c.allocated;
    s.active_bytes[agg].peak = c.peak_allocated;
    s.reserved_bytes[agg].current = c.reserved;
    s.reserved_bytes[agg].peak = c.peak_reserved;
    s.allocation[agg].current = c.allocations;
    s.num_alloc_retries = c.retries;
    s.num_ooms = c.failures;
    return s;
  }

  void resetAccumulatedStats(c10::DeviceIndex index) override { pool(index).reset_accumulated(); }
  void resetPeakStats(c10::DeviceIndex index) override { pool(index).reset_peak(); }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override {
    size_t free_b = 0, total_b = 0;
    if (is_gpu(index)) mem_info(index, &free_b, &total_b);
    return {free_b, total_b};
  }
};

// Pinned host memory, not cached: it is rare and costly to hold.
std::mutex pinned_mu;
std::map<uintptr_t, size_t>& pinned_ranges() {
  static std::map<uintptr_t, size_t> ranges;
  return ranges;
}

void delete_pinned(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(pinned_mu);
    pinned_ranges().erase(reinterpret_cast<uintptr_t>(ptr));
  }
  host_free_pinned(ptr);
}

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return c10::DataPtr(nullptr, nullptr, nullptr, cpu);
    void* p = host_alloc_pinned(n);
    {
      std::lock_guard<std::mutex> lock(pinned_mu);
      pinned_ranges()[reinterpret_cast<uintptr_t>(p)] = n;
    }
    return c10::DataPtr(p, p, &delete_pinned, cpu);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

}  // namespace

Counters counters(c10::DeviceIndex index) { return pool(index).counters(); }
void reset_peak(c10::DeviceIndex index) { pool(index).reset_peak(); }
void reset_accumulated(c10::DeviceIndex index) { pool(index).reset_accumulated(); }
size_t empty_cache(c10::DeviceIndex index) { return pool(index).empty_cache(); }

c10::DeviceAllocator* device_allocator() {
  static SaturnAllocator a;
  return &a;
}

c10::Allocator* pinned_allocator() {
  static PinnedAllocator a;
  return &a;
}

bool is_pinned(const void* ptr) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(pinned_mu);
  auto& ranges = pinned_ranges();
  auto it = ranges.upper_bound(p);
  if (it == ranges.begin()) return false;
  --it;
  return p < it->first + it->second;
}

}  // namespace saturn
