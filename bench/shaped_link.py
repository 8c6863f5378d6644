"""The shaped links of bench/simulated_pods, shared with bench/alpha_beta_model.py, which must
model the same token bucket the benchmark configured, and the simulated pods themselves (network
namespaces on a bridge), shared with bench/recovery_timeline."""
import os
import shutil
import signal
import subprocess


def rate_bits(rate):
    """tc's rate ("1gbit", "500mbit", "100kbit") in bits per second."""
    for unit, factor in (("kbit", 1e3), ("mbit", 1e6), ("gbit", 1e9)):
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * factor
    raise ValueError(f"rate {rate} needs a unit (kbit, mbit, gbit)")


def bucket_bytes(rate):
    """tbf's bucket: 0.25 ms at the rate (31 KB at 1 Gbit/s), at least 16 KiB. A larger bucket,
    refilled while the ranks sit in a barrier, lets a whole op of a few hundred KiB pass at
    memory speed (1 MiB measured 126 % of a 1 Gbit/s link with a 1 MiB bucket). tbf segments a
    GSO packet larger than its bucket, so this does not drop them."""
    return max(16 << 10, int(rate_bits(rate) / 8 * 0.00025))


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def netns_pids(ns):
    """The processes in network namespace `ns`."""
    return [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split() if p.isdigit()]


def remove_pods(prefix):
    """Every process in a `prefix`* namespace SIGKILLed by PID, then the namespaces (and their
    /etc/netns files) deleted."""
    for name in _ip("netns", "list", check=False).stdout.split():
        if name.startswith(prefix):
            for pid in netns_pids(name):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _ip("netns", "del", name, check=False)
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)


def make_pods(prefix, subnet, count, rate=None, mtu=None, hostnames=None):
    """Simulated pods on one bridge, after remove_pods(prefix): a switch namespace `prefix`sw
    holding br0, and pods `prefix`p<i> at `subnet`.<i+1>/24 whose eth0 is a veth to the bridge
    (its end there: v<i>). `rate`: both ends shaped with tbf (bucket_bytes); `mtu`: the bridge's
    and both ends'; `hostnames` (one per pod): each pod's /etc/netns hosts file names them all."""
    remove_pods(prefix)
    switch = prefix + "sw"
    _ip("netns", "add", switch)
    _ip("-n", switch, "link", "add", "br0", "type", "bridge")
    _ip("-n", switch, "link", "set", "br0", *(["mtu", str(mtu)] if mtu else []), "up")
    size = ["mtu", str(mtu)] if mtu else []
    for i in range(count):
        pod = f"{prefix}p{i}"
        _ip("netns", "add", pod)
        _ip("link", "add", "eth0", *size, "netns", pod, "type", "veth", "peer", "name", f"v{i}",
            *size, "netns", switch)
        _ip("-n", pod, "addr", "add", f"{subnet}.{i + 1}/24", "dev", "eth0")
        _ip("-n", pod, "link", "set", "eth0", "up")
        _ip("-n", pod, "link", "set", "lo", "up")
        _ip("-n", switch, "link", "set", f"v{i}", "master", "br0", "up")
        if hostnames:
            os.makedirs(f"/etc/netns/{pod}", exist_ok=True)
            with open(f"/etc/netns/{pod}/hosts", "w") as f:
                f.write("127.0.0.1 localhost\n" + "".join(
                    f"{subnet}.{k + 1} {name}\n" for k, name in enumerate(hostnames)))
        if rate:
            for ns, dev in ((pod, "eth0"), (switch, f"v{i}")):
                _ip("netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                    rate, "burst", str(bucket_bytes(rate)), "latency", "20ms")
