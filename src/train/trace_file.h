#pragma once
// output.trace on disk: one Chrome trace (the JSON trace-event format that Perfetto and
// chrome://tracing open) for the whole run. Every rank's spans (fsdp/trace.h) go to rank 0 at
// the end, which writes the one file (PATH.tmp, then renamed: never a half-written trace), so a
// user opens one file and sees every rank; a process per rank ("pid" = world rank).
//
// Clocks: spans carry each rank's steady_clock (CLOCK_MONOTONIC). Ranks on rank 0's node read
// the same clock, so their offset is exactly 0. For ranks on other nodes the offset is measured
// at start: five rounds of barrier, then every rank reads its clock and the readings are
// all-gathered; the offset is the median of (rank's reading - rank 0's). Its error is the skew
// of the barrier's exit across nodes (microseconds on a fast network) plus the clocks' drift
// over the run (parts per million): fine for seeing phases, not for ordering single messages.
// Every rank's measured offset, and whether it was applied, is in the file's otherData.
//
// A run that stops on an error cannot gather (a rank may be gone), so each rank that catches
// the error writes its own spans to PATH's rank file (trace.json -> trace.rank3.json), also
// through a temporary file: each one opens alone, and their traceEvents concatenate.
#include <string>
#include <vector>

#include "fsdp/trace.h"

namespace fsdp {

class Communicator;

struct TraceClock {
  double origin_s = 0;             // rank 0's clock at the start: the trace's time 0
  double offset_s = 0;             // this rank's clock minus rank 0's, as applied
  std::vector<double> measured_s;  // every rank's measured offset
  std::vector<int> applied;        // 1 where it was applied (another node than rank 0's)
};

// Collective over world.
TraceClock align_trace_clock(Communicator& world, const std::vector<int>& node_color_of_rank);

// This rank's spans as trace events (comma-separated JSON objects, metadata included).
std::string trace_events_json(const std::vector<TraceEvent>& events, int rank, const TraceClock& clock, bool device);

// Collective over world: rank 0 writes `path` with every rank's events. Throws Error naming
// output.trace when the file cannot be written (on rank 0).
void write_trace(Communicator& world, const std::string& path, const std::vector<TraceEvent>& events,
                 const TraceClock& clock, bool device);
// Not collective: this rank's events to rank_trace_path(path, rank); returns that path.
std::string write_rank_trace(const std::string& path, int rank, const std::vector<TraceEvent>& events,
                             const TraceClock& clock, bool device);
std::string rank_trace_path(const std::string& path, int rank);

}  // namespace fsdp
