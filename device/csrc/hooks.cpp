// PrivateUse1 hooks: availability, generators, pinned memory, storage resize.
#include "allocator.h"
#include "driver.h"
#include "guard.h"
#include "storage.h"
#include "hooks.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <memory>
#include <mutex>
#include <vector>

namespace saturn {
namespace {

// Random numbers on saturn devices are drawn on the host (the fallback runs the
// CPU kernels), so a saturn generator is a CPU Philox/MT generator tagged with
// the saturn device for seeding and state.
class Generator final : public at::CPUGeneratorImpl {
 public:
  explicit Generator(c10::DeviceIndex index) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::once_flag once;
  static std::vector<at::Generator> gens;
  std::call_once(once, [] {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      gens.push_back(at::make_generator<Generator>(i));
      gens.back().set_current_seed(c10::detail::getNonDeterministicRandom());
    }
  });
  return gens.at(resolve(index));
}

namespace {

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }  // saturn:0 always exists
  bool hasPrimaryContext(c10::DeviceIndex index) const override {
    check_index(index);
    return true;
  }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_current_device(index); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const auto old = current_device();
    set_current_device(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<Generator>(resolve(index));
  }
  at::Device getDeviceFromPtr(void*) const override {
    return c10::Device(c10::DeviceType::PrivateUse1, current_device());
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), newsize);
  }
};

struct Register {
  Register() {
    static Hooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
    c10::SetAllocator(c10::DeviceType::PrivateUse1, device_allocator());
  }
};
Register register_once;

}  // namespace
}  // namespace saturn
