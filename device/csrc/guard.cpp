#include "guard.h"

#include "driver.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace saturn {
namespace {

thread_local c10::DeviceIndex tls_current = 0;

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

  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream& s) const override { synchronize(s.device_index()); }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    synchronize(resolve(index));
  }
  // Events: all work on a device is in one stream, so ordering is already total.
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag)
      const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
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
