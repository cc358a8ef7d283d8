#pragma once
// The flows a stopping boundary must end, each with its log line, instead of dropping them
// (docs/sam-box.md, "Stopping"). Every serving coroutine registers an Entry for as long as it
// runs; stopAll() calls each entry's `end`, which closes the flow's sockets so that its
// coroutine unwinds through its usual ending (the flow line, the metrics), and reports when
// the last one is gone. An intrusive list: registering allocates nothing. Single-threaded
// (the io_context thread).

#include <cstddef>
#include <functional>
#include <utility>

namespace sambox {

class OpenFlows {
 public:
  class Entry {
   public:
    /// Registers a flow; `end` must make it finish soon without waiting for a peer (close its
    /// sockets). Registered while the list is stopping, the flow is ended at once.
    Entry(OpenFlows& list, std::function<void()> end) : list_(list), end_(std::move(end)) {
      next_ = list_.head_;
      if (next_ != nullptr) next_->prev_ = this;
      list_.head_ = this;
      ++list_.size_;
      if (list_.stopping_) end_();
    }
    ~Entry() {
      if (prev_ != nullptr) {
        prev_->next_ = next_;
      } else {
        list_.head_ = next_;
      }
      if (next_ != nullptr) next_->prev_ = prev_;
      --list_.size_;
      if (list_.stopping_ && list_.size_ == 0) list_.drained();
    }
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;

   private:
    friend class OpenFlows;
    OpenFlows& list_;
    std::function<void()> end_;
    Entry* prev_ = nullptr;
    Entry* next_ = nullptr;
  };

  OpenFlows() = default;
  OpenFlows(const OpenFlows&) = delete;
  OpenFlows& operator=(const OpenFlows&) = delete;

  /// Ends every registered flow, and from now on every flow registered. `drained` runs once,
  /// when none is left (at once if none is open). Returns the number of flows ended.
  size_t stopAll(std::function<void()> drained) {
    stopping_ = true;
    drained_ = std::move(drained);
    const size_t ended = size_;
    // `end` closes sockets; the handlers that unregister run later, from the event loop, so
    // the list does not change under this walk.
    for (Entry* e = head_; e != nullptr; e = e->next_) e->end_();
    if (size_ == 0) this->drained();
    return ended;
  }
  [[nodiscard]] size_t size() const { return size_; }
  [[nodiscard]] bool stopping() const { return stopping_; }

 private:
  void drained() {
    if (auto f = std::exchange(drained_, nullptr)) f();
  }

  Entry* head_ = nullptr;
  size_t size_ = 0;
  bool stopping_ = false;
  std::function<void()> drained_;
};

}  // namespace sambox
