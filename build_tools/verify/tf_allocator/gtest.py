"""Running the allocator program, the LMS tests it must hold, and reading gtest's XML report."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ..tf_release import log_to

__all__ = ["LMS_TESTS", "WRITERS_TEST", "gtest_results", "run_tests"]

log = log_to("tf_allocator")


def run_tests(binary: Path, gtest_filter: str | None = None,
              xml: Path | None = None, env: dict | None = None) -> int:
    cmd = [str(binary)]
    if gtest_filter:
        cmd.append(f"--gtest_filter={gtest_filter}")
    if xml:
        cmd.append(f"--gtest_output=xml:{xml}")
    log("running " + " ".join(cmd))
    return subprocess.run(cmd, env={**os.environ, **(env or {})}).returncode


# The LMS tests the program holds (CONFORMANCE / lms_bfc_allocator_test.cc and
# bfc_chunk_handle_table_test.cc), every one of which must pass wherever the program runs: on the
# CPU (tests/test_tensorflow_allocator.py) and on a GPU (tests/conformance/tensorflow_allocator).
# A test dropped from the build fails both.
LMS_TESTS = (
    "AllowGrowthAndGc/LmsOversubscription.TwiceTheDeviceServedWithLmsBytesIntact/0",
    "AllowGrowthAndGc/LmsOversubscription.TwiceTheDeviceServedWithLmsBytesIntact/1",
    "AllowGrowthAndGc/LmsOversubscription.TwiceTheDeviceServedWithLmsBytesIntact/2",
    "AllowGrowthAndGc/LmsOversubscription.TwiceTheDeviceServedWithLmsBytesIntact/3",
    "LmsBfc.TwiceTheDeviceRefusedWithoutLms",
    "LmsBfc.SpilledDataUsableInPlaceAndBroughtBack",
    "LmsBfc.TouchChangesTheVictim",
    "LmsBfc.DefragRemapsFreePagesWithoutMovingTensors",
    "LmsBfc.FragmentationWithoutDefragHintsToEnableIt",
    "LmsBfc.FragmentationWithoutDefragIsServedBySpilling",
    "LmsBfc.HostLimitErrorNamesTheVariable",
    "LmsBfc.AFailedPageMoveLosesNothing",
    "LmsBfc.RandomWorkloadBytesIntact",
    "LmsBfc.BackwardFreesReturnSpilledDataInBatches",
    "HostPagesMadeAhead/LmsBandwidth.SpillAndReturnBandwidth/0",
    "HostPagesMadeAhead/LmsBandwidth.SpillAndReturnBandwidth/1",
    "LmsBfc.PageAndReserveSettings",
    "LmsBfc.SpillAtTheHostLimitWaitsForThePageBeingMade",
    "LmsBfc.HostPagesMadeAheadWithinTheHostBudget",
    "LmsBfc.PlainSubAllocatorKeepsLmsOff",
    "LmsBfc.WritersOnOtherThreadsWhilePagesMove",
    "BfcChunkHandleTable.OnlyWrittenSlotsTakeMemoryAndGrowthKeepsThem",
    "BfcChunkHandleTable.MappedWithoutReservingSwap",
    "LmsFailure.NoGateRefusesToMovePagesOfLiveTensors",
    "LmsFailure.DoubleFaultDuringAMoveSharesNoPage",
    "LmsFailure.FailedPageCreationFailsTheAllocationNotTheProcess",
    "LmsFailure.FailedSwapInReportsTheErrorAndLosesNothing",
    "LmsFailure.GarbageCollectionUnmapsInAQuietScope",
    "LmsFailure.HostMemLimitBadNegativeAndHugeValues",
    "LmsFailure.PinnedHostPagesGivenBackAfterASpike",
    "LmsLaunchGate.FindsCuptiWherePipAndTheToolkitPutIt",
)
# gtest skips the writers test where the launch gate is inactive
WRITERS_TEST = "LmsBfc.WritersOnOtherThreadsWhilePagesMove"


def gtest_results(xml: Path) -> dict:
    """{"Suite.Test": "failed" or gtest's result/status} from a --gtest_output=xml report."""
    import xml.etree.ElementTree as ET
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        out[f"{case.get('classname')}.{case.get('name')}"] = (
            "failed" if failed else case.get("result", case.get("status")))
    return out
