// Caching allocator for every saturn device, and the pinned host allocator.
//
// Sizes round up to a class (512 B steps below 1 MiB, 2 MiB steps above); a freed
// block goes on its device's free list for that class and is handed out again
// without a driver call. All of saturn's work on a GPU runs on one stream, so a
// block freed by the host can be reused by the next queued operation at once:
// no stream tracking is needed. On out-of-memory the cache is released and the
// allocation retried once.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>

namespace saturn {

constexpr size_t kAlignment = 512;
constexpr size_t kSmallLimit = size_t{1} << 20;  // 1 MiB
constexpr size_t kSmallStep = 512;
constexpr size_t kLargeStep = size_t{2} << 20;  // 2 MiB

size_t size_class(size_t bytes);

// The counters saturn reports per device (bytes are rounded sizes).
struct Counters {
  int64_t allocated = 0;       // bytes handed out and not yet freed
  int64_t reserved = 0;        // bytes held from the system (handed out + cached)
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;
  int64_t hits = 0;            // allocations served from the cache
  int64_t misses = 0;          // allocations that went to the system
  int64_t retries = 0;         // out-of-memory, cache released, tried again
  int64_t failures = 0;        // out-of-memory after the retry
  int64_t allocations = 0;     // live blocks
};

Counters counters(c10::DeviceIndex index);
void reset_peak(c10::DeviceIndex index);
void reset_accumulated(c10::DeviceIndex index);
// Releases every cached (free) block of one device; returns the bytes released.
size_t empty_cache(c10::DeviceIndex index);

c10::DeviceAllocator* device_allocator();
c10::Allocator* pinned_allocator();
bool is_pinned(const void* ptr);

}  // namespace saturn
