// tests/test_setup.cpp: what every test binary sets up once, linked into each of them.
//   - Poisoning of new tensors (see test_helpers.h): a static initialiser that sets a flag; it
//     touches no CUDA state, so test discovery at build time stays safe on machines without a GPU.
//   - Every test case starts from the generators' initial states (the tests' generator and the
//     default one), whatever ran before it in the same process. ctest runs each case in a process
//     of its own; a filtered run of several cases in one process (a Catch2 tag, compute-sanitizer
//     over a list) then draws the same inputs as ctest does, so a failure seen one way is
//     reproduced the other.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include "test_helpers.h"

namespace {

const bool g_poison_on = (fg::set_poison_new_tensors(true), true);

struct InitialGeneratorsPerTestCase : fg::test::EventListenerBase {
    using Base = fg::test::EventListenerBase;
    using Base::Base;
    void testCaseStarting(Catch::TestCaseInfo const& info) override {
        fg::test::reset_generators();
        Base::testCaseStarting(info);
    }
};

}  // namespace

CATCH_REGISTER_LISTENER(InitialGeneratorsPerTestCase)
