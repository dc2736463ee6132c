"""bench/gpu_energy.py: the energy a GPU spends while a command runs, from NVML's total-energy
counter (millijoules since the driver loaded), with the card's power and SM clock sampled about
every 20 ms beside it. NVML is reached through ctypes (libnvidia-ml.so.1, the driver's): no package.

usage: python3 bench/gpu_energy.py [--gpu I] [--label TEXT] [--csv FILE] -- command ...

The windows measured: each pair of lines "energy: start" and "energy: stop" that the command
prints (bench_gemm --sustained prints one pair for each --tokens), one summary line a pair; where
it prints none, the middle 60% of the span in which the card drew more than 350 W (a training
run's steady steps, without its start-up and its end). The command's output passes through; the
summaries follow it: the window's energy (J), its mean power (the counter's energy over the
window's time, W), the sampled power's median and the SM clock's median, 10th and 90th
percentiles (MHz). A step's energy is the mean power times its time. --csv keeps every sample
(seconds from the first, energy mJ, power mW, SM clock MHz). The exit status is the command's
(128 + the signal that ended it), or 1 where it succeeded but left nothing to measure."""
import argparse
import ctypes
import subprocess
import sys
import threading
import time

HOT_MW = 350_000  # above this the card is taken to be running the command's work
NVML_CLOCK_SM = 1
MARKS = {"energy: start": "start", "energy: stop": "stop"}


def nvml_device(index):
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        sys.exit(f"gpu_energy: cannot load NVML (libnvidia-ml.so.1, the NVIDIA driver's): {e}")
    if nvml.nvmlInit_v2() != 0:
        sys.exit("gpu_energy: cannot use NVML: nvmlInit failed (no NVIDIA driver running?)")
    handle = ctypes.c_void_p()
    if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
        sys.exit(f"gpu_energy: cannot use NVML: it has no GPU {index}")
    if sample(nvml, handle) is None:
        sys.exit(f"gpu_energy: cannot use NVML: GPU {index} has no energy counter, power or "
                 "clock reading (the energy counter needs Volta or newer)")
    return nvml, handle


def sample(nvml, handle):
    """(time s, energy mJ, power mW, SM clock MHz), or None where NVML fails to read one."""
    energy, power, clock = ctypes.c_ulonglong(), ctypes.c_uint(), ctypes.c_uint()
    now = time.monotonic()
    if (nvml.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(energy)) != 0 or
            nvml.nvmlDeviceGetPowerUsage(handle, ctypes.byref(power)) != 0 or
            nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM, ctypes.byref(clock)) != 0):
        return None
    return now, energy.value, power.value, clock.value


def windows(rows, marks):
    """The (first, last) sample indices of each window measured, None for a marked window too
    short to measure (under two samples). rows: (time s, energy mJ, power mW, SM clock MHz) by
    time; marks: (time, "start" or "stop") of the command's marker lines, in order. A start
    opens a window (a second start before a stop is ignored), the next stop closes it; a stop
    with no open window and a start never closed are dropped. Without a start, the hot span."""
    if any(what == "start" for _, what in marks):
        spans, opened = [], None
        for t, what in marks:
            if what == "start" and opened is None:
                opened = t
            elif what == "stop" and opened is not None:
                inside = [i for i, r in enumerate(rows) if opened <= r[0] <= t]
                spans.append((inside[0], inside[-1]) if len(inside) >= 2 else None)
                opened = None
        return spans
    hot = [i for i, r in enumerate(rows) if r[2] > HOT_MW]
    if len(hot) < 10:
        return []
    first, last = hot[0], hot[-1]
    return [(first + (last - first) // 5, last - (last - first) // 5)]


def summary(rows, span, label=""):
    """The summary line of the samples rows[first..last] (span = (first, last))."""
    a, b = span
    seconds = rows[b][0] - rows[a][0]
    joules = (rows[b][1] - rows[a][1]) / 1000.0
    power = sorted(r[2] / 1000.0 for r in rows[a:b + 1])
    clock = sorted(r[3] for r in rows[a:b + 1])
    n = len(clock)
    return ("%senergy %.1f J over %.2f s: mean power %.1f W (sampled median %.0f W); SM clock "
            "median %d MHz (p10 %d, p90 %d)" % (label + ": " if label else "", joules, seconds,
                                                joules / seconds, power[n // 2], clock[n // 2],
                                                clock[n // 10], clock[9 * n // 10]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", type=int, default=0, help="NVML's index of the GPU (default 0)")
    ap.add_argument("--label", default="", help="text to begin each summary line with")
    ap.add_argument("--csv", help="write every sample to this file")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given (put it after --)")
    nvml, handle = nvml_device(args.gpu)
    rows, marks, done = [], [], threading.Event()

    def sampler():
        while not done.is_set():
            row = sample(nvml, handle)
            if row is not None:  # a failed reading is skipped, not counted as zero
                rows.append(row)
            time.sleep(0.02)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, bufsize=1,
                                 errors="replace")
    except OSError as e:
        done.set()
        sys.exit(f"gpu_energy: cannot run {command[0]}: {e}")
    for line in child.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        mark = MARKS.get(line.strip())
        if mark:
            marks.append((time.monotonic(), mark))
    status = child.wait()
    status = 128 - status if status < 0 else status  # killed by a signal: as a shell says it
    done.set()
    thread.join()
    if args.csv:
        with open(args.csv, "w") as f:
            f.writelines("%.3f,%d,%d,%d\n" % ((r[0] - rows[0][0],) + r[1:]) for r in rows)
    spans = windows(rows, marks)
    if not spans:
        print("gpu_energy: nothing to measure%s: %s" % (
            f" for {args.label}" if args.label else "",
            "no 'energy: stop' line after an 'energy: start'" if marks else
            "no start and stop lines, and too few samples over 350 W"), file=sys.stderr)
        return status or 1
    for k, span in enumerate(spans):
        name = args.label + (f" (window {k + 1})" if len(spans) > 1 else "")
        if span is None:
            print(f"gpu_energy: {name + ': ' if name else ''}window too short to measure",
                  file=sys.stderr)
            status = status or 1
        else:
            print(summary(rows, span, name))
    return status


if __name__ == "__main__":
    sys.exit(main())
