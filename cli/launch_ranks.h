// cli/launch_ranks.h: `fusegrad train ... --ranks N`, several ranks on this host started as
// torchrun would start them.
#pragma once

#include <string>
#include <vector>

namespace fg::cli {

// Starts `ranks` copies of this program with `args` (its command line without --ranks), each told
// its rank as torchrun tells it (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and given
// one job token, and waits for them. Returns the exit status the command should have: 0, 130
// when stopped by Ctrl-C / SIGTERM, else the first failing rank's.
int launch_ranks(long ranks, const std::vector<std::string>& args);

}  // namespace fg::cli
