// The records of the C++ torch runner's forwards (records.cc): what a
// backward needs (the forward's arguments and outputs, and through them its
// autograd graph), kept from the forward until TF frees the handle that
// names it, or under XLA until its traced backwards took it.

#ifndef TORCHBRIDGE_CSRC_EXPORTED_RECORDS_H_
#define TORCHBRIDGE_CSRC_EXPORTED_RECORDS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchbridge::exported {

struct Record {
  std::vector<at::Tensor> args;  // the forward's arguments, leaves where floating
  std::vector<at::Tensor> outs;  // its outputs, and through them its graph
};

// One program's records. Programs are never freed (a handle's deleter may
// run after its op's graph is gone), so neither is this.
struct Records {
  std::mutex mutex;
  std::unordered_map<void*, std::unique_ptr<Record>> by_handle;  // handle -> record
  // Under XLA (jit_compile=True) the handle is an int64 id, and the record
  // lives here until as many backwards as were traced with it took it.
  std::unordered_map<int64_t, std::pair<std::unique_ptr<Record>, int64_t>> by_id;
  int64_t next_id = 1;
  int64_t made = 0;  // records made so far
};

// The handle of `record`: a one-byte torch tensor whose memory's deleter
// drops the record when TF frees the handle.
at::Tensor MakeHandle(Records* records, std::unique_ptr<Record> record);

// A handle under XLA: an int64 id of `record`, which lives until
// `backwards` (at least 1) backward calls took it.
at::Tensor MakeIdHandle(Records* records, std::unique_ptr<Record> record,
                        int64_t backwards);

// The record `handle` names, or nullptr. By id (`by_id`, under XLA) the
// last of its traced backwards takes it into `*last`, which then keeps it
// alive for that backward.
Record* FindRecord(Records* records, const at::Tensor& handle, bool by_id,
                   std::unique_ptr<Record>* last);

}  // namespace torchbridge::exported

#endif  // TORCHBRIDGE_CSRC_EXPORTED_RECORDS_H_
