"""Shared by the Python benchmarks: how they describe the machine in their saved results."""
import os
import platform


def machine():
    """'<cpu model>, <n> cores, <os> <release>' for bench/baselines/*.json."""
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"
