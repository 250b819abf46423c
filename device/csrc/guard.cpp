#include "guard.h"

#include "driver.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>

namespace saturn {
namespace {

thread_local c10::DeviceIndex tls_current = 0;

// What a c10::Event of a saturn device holds: a CUDA event on a GPU; on saturn:0, whose
// work runs on the host as it is issued, the host clock when it was recorded.
struct Event {
  c10::DeviceIndex index = 0;
  bool timing = false;
  bool recorded = false;
  void* cu = nullptr;
  std::chrono::steady_clock::time_point at{};
};

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }

  c10::Device getDevice() const override { return c10::Device(kType, current_device()); }

  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "saturn device guard got a ", d.type(), " device");
    set_current_device(resolve(d.index()));
  }

  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) tls_current = d.index();
  }

  // One stream per device: id 0.
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kType, resolve(d.index())));
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return getStream(d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getStream(d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return getStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return s; }

  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  bool queryStream(const c10::Stream& s) const override {
    const c10::DeviceIndex index = resolve(s.device_index());
    return is_gpu(index) ? stream_query(index) : true;  // saturn:0 runs as work is issued
  }
  void synchronizeStream(const c10::Stream& s) const override { synchronize(s.device_index()); }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    synchronize(resolve(index));
  }
  // Events. One stream per device orders its work; events mark points in it (CUDA
  // events on a GPU), so torch.Event times, queries and waits as on CUDA.
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "saturn: an event of saturn:", device_index, " recorded on a stream of saturn:",
                stream.device_index());
    const c10::DeviceIndex index = resolve(stream.device_index());
    auto* e = static_cast<Event*>(*event);
    if (e == nullptr) {
      e = new Event();
      e->index = index;
      e->timing = flag == c10::EventFlag::BACKEND_DEFAULT;
      if (is_gpu(index)) e->cu = event_create(index, e->timing);
      *event = e;
    }
    TORCH_CHECK(e->index == index, "saturn: an event of saturn:", e->index,
                " recorded on saturn:", index);
    if (is_gpu(index)) {
      event_record(index, e->cu);
    } else {
      e->at = std::chrono::steady_clock::now();
    }
    e->recorded = true;
  }
  void block(void* event, const c10::Stream& stream) const override {
    auto* e = static_cast<Event*>(event);
    if (e == nullptr || !e->recorded || !is_gpu(e->index)) return;
    stream_wait_event(resolve(stream.device_index()), e->cu);
  }
  bool queryEvent(void* event) const override {
    auto* e = static_cast<Event*>(event);
    if (e == nullptr || !e->recorded || !is_gpu(e->index)) return true;
    return event_query(e->index, e->cu);
  }
  void synchronizeEvent(void* event) const override {
    auto* e = static_cast<Event*>(event);
    if (e == nullptr || !e->recorded || !is_gpu(e->index)) return;
    event_synchronize(e->index, e->cu);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->recorded && b->recorded,
                "saturn: both events must be recorded before elapsed_time");
    TORCH_CHECK(a->timing && b->timing,
                "saturn: both events need enable_timing=True for elapsed_time");
    TORCH_CHECK(a->index == b->index, "saturn: events of two devices (saturn:", a->index,
                " and saturn:", b->index, ")");
    if (is_gpu(a->index)) return event_elapsed_ms(a->index, a->cu, b->cu);
    return std::chrono::duration<double, std::milli>(b->at - a->at).count();
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    auto* e = static_cast<Event*>(event);
    if (e == nullptr) return;
    if (e->cu != nullptr) event_destroy(e->index, e->cu);
    delete e;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace

c10::DeviceIndex current_device() { return tls_current; }

void set_current_device(c10::DeviceIndex index) {
  check_index(index);
  make_current(index);
  tls_current = index;
}

c10::DeviceIndex resolve(c10::DeviceIndex index) {
  if (index < 0) return current_device();
  check_index(index);
  return index;
}

}  // namespace saturn
