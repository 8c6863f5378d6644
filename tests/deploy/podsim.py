"""Runs the pods of a rendered Kubernetes Job on this machine, as a kubelet would, without a cluster.

Each pod gets what its spec asks for and Kubernetes provides:
  - its own network namespace, cabled to a bridge in a separate "switch" namespace (the host's own
    network is never touched), and an /etc/hosts (through /etc/netns/<ns>/hosts) where
    <job>-<i>.<subdomain> resolves the way the headless Service's DNS records would;
  - its own UTS namespace with hostname <job>-<index> (Indexed Job) and JOB_COMPLETION_INDEX;
  - its own mount namespace and root: the host's /usr and /etc read-only (standing in for the
    image), a tmpfs root that is read-only when readOnlyRootFilesystem is set, the container's
    volumeMounts (PVC -> a shared directory, emptyDir -> a private one or tmpfs for medium
    Memory, subPath and readOnly honoured);
  - its command and args with $(VAR) expanded from env and envFrom (ConfigMaps of the render),
    downward-API fieldRef and resourceFieldRef values, run as runAsUser/runAsGroup/fsGroup with
    no_new_privs.
Or, with an image, the same namespaces and mounts for `podman run` of the real image.

Every pod group runs under a hard deadline; on the way out every process in the namespaces is
killed by PID and every namespace and /etc/netns entry removed, also after a crash of an earlier
run (names carry the creating PID).
"""

import base64
import ctypes
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import yaml

NETNS_PREFIX = "ddpsim-"
SUBNET = "10.77.0"  # inside the test's own switch namespace only
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SKIP = 77  # CTest SKIP_RETURN_CODE


class PodSimError(Exception):
    pass


def skip_unless_root(what):
    """Exits with the skip code and the reason when namespaces cannot be made here."""
    if os.geteuid() != 0:
        print(f"SKIP: {what} needs root (network, UTS and mount namespaces); run as root", flush=True)
        sys.exit(SKIP)
    probe = f"{NETNS_PREFIX}{os.getpid()}-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"SKIP: {what}: cannot create a network namespace here: {r.stderr.strip()}", flush=True)
        sys.exit(SKIP)
    subprocess.run(["ip", "netns", "del", probe], check=True)


def load_render(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def find(objs, kind, name=None):
    for o in objs:
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name):
            return o
    raise PodSimError(f"no {kind} {name or ''} in the render")


# ---- Kubernetes semantics -----------------------------------------------------------------------

def expand(text, env):
    """Kubernetes $(VAR) expansion: defined names are replaced, $$ escapes, the rest stays."""
    def sub(m):
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$\(\w+\)|\$\((\w+)\)", sub, text)


def quantity_ceil(q, divisor="1"):
    """resourceFieldRef value: quantity / divisor, rounded up (as the kubelet does)."""
    def value(s):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?", str(s))
        if not m:
            raise PodSimError(f"cannot read quantity {s}")
        scale = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                 "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group(2)]
        return float(m.group(1)) * scale
    return str(math.ceil(value(q) / value(divisor)))


class Pod:
    """One pod of a Job: names, address, and the environment Kubernetes gives its container."""

    def __init__(self, job, objs, index, ip, namespace):
        self.job = job
        self.index = index
        self.ip = ip
        self.spec = job["spec"]["template"]["spec"]
        self.container = self.spec["containers"][0]
        job_name = job["metadata"]["name"]
        indexed = job["spec"].get("completionMode") == "Indexed"
        self.name = f"{job_name}-{index}-sim{os.getpid() % 100000:05d}"
        self.hostname = f"{job_name}-{index}" if indexed else self.name
        self.subdomain = self.spec.get("subdomain")
        self.namespace = namespace
        self.labels = dict(job["spec"]["template"].get("metadata", {}).get("labels", {}))
        self.annotations = {}
        self.labels["job-name"] = self.labels["batch.kubernetes.io/job-name"] = job_name
        if indexed:
            self.labels["batch.kubernetes.io/job-completion-index"] = str(index)
            self.annotations["batch.kubernetes.io/job-completion-index"] = str(index)
        self.env = self._environment(objs, indexed)
        self.command = [expand(a, self.env) for a in self.container.get("command", [])]
        self.args = [expand(a, self.env) for a in self.container.get("args", [])]
        if not self.command:
            raise PodSimError(f"{self.name}: the container has no command (the image's entrypoint "
                              "is not known here)")

    def fqdn(self):
        if not self.subdomain:
            return None
        return f"{self.hostname}.{self.subdomain}.{self.namespace}.svc.cluster.local"

    def _field(self, path):
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if m:
            return (self.labels if m.group(1) == "labels" else self.annotations).get(m.group(2), "")
        fields = {"metadata.name": self.name, "metadata.namespace": self.namespace,
                  "status.podIP": self.ip, "status.hostIP": self.ip,
                  "spec.nodeName": socket.gethostname(),
                  "spec.serviceAccountName": self.spec.get("serviceAccountName", "default")}
        if path not in fields:
            raise PodSimError(f"fieldRef {path} is not simulated")
        return fields[path]

    def _environment(self, objs, indexed):
        env = {"PATH": IMAGE_PATH, "HOSTNAME": self.hostname}
        if indexed:
            env["JOB_COMPLETION_INDEX"] = str(self.index)
        for source in self.container.get("envFrom", []):
            ref = source.get("configMapRef")
            if not ref:
                raise PodSimError(f"envFrom {source} is not simulated")
            data = find(objs, "ConfigMap", ref["name"]).get("data", {})
            env.update({source.get("prefix", "") + k: v for k, v in data.items()})
        for e in self.container.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
            elif "fieldRef" in e.get("valueFrom", {}):
                env[e["name"]] = self._field(e["valueFrom"]["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in e.get("valueFrom", {}):
                ref = e["valueFrom"]["resourceFieldRef"]
                kind, resource = ref["resource"].split(".", 1)
                q = self.container["resources"][kind][resource]
                env[e["name"]] = quantity_ceil(q, ref.get("divisor", "1"))
            elif "configMapKeyRef" in e.get("valueFrom", {}):
                ref = e["valueFrom"]["configMapKeyRef"]
                env[e["name"]] = find(objs, "ConfigMap", ref["name"])["data"][ref["key"]]
            else:
                raise PodSimError(f"env {e['name']}: {e.get('valueFrom')} is not simulated")
        return env


# ---- the simulated cluster ----------------------------------------------------------------------

def _run(*cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise PodSimError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_netns_processes(ns):
    r = _run("ip", "netns", "pids", ns, check=False)
    for pid in r.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _remove_netns(ns):
    _kill_netns_processes(ns)
    _run("ip", "netns", "del", ns, check=False)
    shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


def remove_stale_namespaces():
    """Namespaces left by a run that was killed: their creator's PID is gone."""
    r = _run("ip", "netns", "list", check=False)
    for line in r.stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        m = re.match(rf"{NETNS_PREFIX}(\d+)-", ns)
        if m and not _alive(int(m.group(1))):
            _remove_netns(ns)


class Cluster:
    """A switch namespace with a bridge; pods are namespaces cabled to it. Use as a context."""

    def __init__(self, workdir, namespace="default"):
        self.workdir = workdir
        self.namespace = namespace
        self.prefix = f"{NETNS_PREFIX}{os.getpid()}-"
        self.switch = self.prefix + "switch"
        self.namespaces = []
        self.containers = []
        self.next_host = 10
        self.port = 0
        self.objs = []
        self.services = {}  # a Service's name -> the pod behind it (cluster DNS, simulated)

    def __enter__(self):
        remove_stale_namespaces()
        self._add_netns(self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        return self

    def __exit__(self, *exc):
        for name in self.containers:
            subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)
        for ns in reversed(self.namespaces):
            _remove_netns(ns)
        return False

    def _add_netns(self, ns):
        _run("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")

    def make_pods(self, objs, job_name, count=None, job=None):
        """The pods of the render's Job job_name, or of `job` (a Job-shaped object a controller
        would create, e.g. an MPIJob's workers), each in its own namespace on the switch."""
        self.objs = objs
        job = job if job is not None else find(objs, "Job", job_name)
        n = count if count is not None else job["spec"].get("completions", 1)
        pods = []
        for i in range(n):
            ip = f"{SUBNET}.{self.next_host}"
            self.next_host += 1
            pods.append(Pod(job, objs, i, ip, self.namespace))
        for pod in pods:
            pod.netns = self.prefix + pod.hostname
            self._add_netns(pod.netns)
            self.port += 1
            port = f"p{self.port}"
            _run("ip", "-n", self.switch, "link", "add", port, "type", "veth",
                 "peer", "name", "eth0", "netns", pod.netns)
            _run("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
            _run("ip", "-n", pod.netns, "addr", "add", f"{pod.ip}/24", "dev", "eth0")
            _run("ip", "-n", pod.netns, "link", "set", "eth0", "up")
            self._write_resolver_files(pod, pods)
        return pods

    def add_service(self, name, pod):
        """A Service name that resolves to `pod` (as a ClusterIP Service with one ready pod
        behind it), in the records publish() writes next."""
        self.services[name] = pod

    def publish(self, pods):
        """Every pod's DNS records seen by every other, for pods made by several make_pods calls
        (several Services' or controllers' pods in one namespace)."""
        for pod in pods:
            self._write_resolver_files(pod, pods)

    def _write_resolver_files(self, pod, group):
        """/etc/hosts as the kubelet writes it, plus the Service's DNS records for the group."""
        lines = ["# Kubernetes-managed hosts file (simulated).", "127.0.0.1\tlocalhost",
                 "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines.append(f"{pod.ip}\t{pod.fqdn()}\t{pod.hostname}" if pod.fqdn()
                     else f"{pod.ip}\t{pod.hostname}")
        lines.append("# The headless Service's DNS records (cluster DNS, simulated).")
        for p in group:
            if p.subdomain:
                lines.append(f"{p.ip}\t{p.fqdn()}\t{p.hostname}.{p.subdomain}\t"
                             f"{p.hostname}.{p.subdomain}.{p.namespace}.svc")
        for name, target in self.services.items():
            lines.append(f"{target.ip}\t{name}\t{name}.{target.namespace}.svc\t"
                         f"{name}.{target.namespace}.svc.cluster.local")
        d = f"/etc/netns/{pod.netns}"
        os.makedirs(d, exist_ok=True)
        with open(f"{d}/hosts", "w") as f:
            f.write("\n".join(lines) + "\n")
        # Names outside the records fail at once instead of waiting for an unreachable server.
        with open(f"{d}/resolv.conf", "w") as f:
            f.write(f"search {pod.namespace}.svc.cluster.local svc.cluster.local cluster.local\n"
                    "nameserver 127.0.0.53\noptions ndots:5 timeout:1 attempts:1\n")

    # ---- running pods ---------------------------------------------------------------------------

    def run_pods(self, pods, shared_dir, deadline_s, bind_dirs=(), path_prepend=(),
                 home="/home/ddp", image=None, log=print, when=None, finish_with=()):
        """Starts every pod, waits for all of them until the deadline; returns {name: exit code}
        (None for a pod killed at the deadline) and each pod's output in pod.output.
        when: (condition, action) pairs; while the pods run, each action(pod -> pid) runs once,
        as soon as its condition() holds (e.g. "a checkpoint exists" -> "SIGTERM pod 1").
        finish_with: pods whose end ends the run, as an MPIJob's launcher does: the others are
        then killed, and their code is None."""
        procs = {}
        # image: one for every pod, or {pod name: image} with the pods not named on the host.
        image_of = (lambda pod: image.get(pod.name)) if isinstance(image, dict) else (lambda pod: image)
        for pod in pods:
            pod.output = []
            if image_of(pod):
                argv = self._podman_argv(pod, shared_dir, image_of(pod), home)
            else:
                spec_file = os.path.join(self.workdir, f"{pod.name}.json")
                with open(spec_file, "w") as f:
                    json.dump(self._init_spec(pod, shared_dir, bind_dirs, path_prepend, home), f)
                argv = ["ip", "netns", "exec", pod.netns, "unshare", "--uts", "--mount",
                        "--propagation", "private", "--", sys.executable, os.path.abspath(__file__),
                        "pod-init", spec_file]
            procs[pod.name] = (pod, subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True))
        readers = []
        for pod, proc in procs.values():
            t = threading.Thread(target=_pump, args=(pod, proc.stdout, log), daemon=True)
            t.start()
            readers.append(t)
        pending = list(when or [])
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and any(p.poll() is None for _, p in procs.values()):
            if finish_with and all(procs[p.name][1].poll() is not None for p in finish_with):
                log("podsim: " + ", ".join(p.name for p in finish_with) + " ended; stopping the rest")
                break
            for item in [w for w in pending if w[0]()]:
                pending.remove(item)
                item[1]({pod.hostname: proc.pid for pod, proc in procs.values()})
            time.sleep(0.1)
        # As a container runtime reports it: a process killed by signal N exited 128 + N.
        codes = {name: (None if proc.poll() is None else proc.poll() if proc.poll() >= 0
                        else 128 - proc.poll()) for name, (_, proc) in procs.items()}
        if any(c is None for c in codes.values()):
            if not finish_with or time.monotonic() >= end:
                log(f"podsim: deadline of {deadline_s:.0f} s passed; killing every pod")
            for pod, proc in procs.values():
                _killpg(proc)
                _kill_netns_processes(pod.netns)
                if image_of(pod):
                    subprocess.run(["podman", "rm", "-f", "-t", "0", self._container(pod)],
                                   capture_output=True)
            for _, proc in procs.values():
                proc.wait()
        for t in readers:
            t.join(timeout=5)
        return codes

    def _init_spec(self, pod, shared_dir, bind_dirs, path_prepend, home):
        env = dict(pod.env)
        if path_prepend:
            env["PATH"] = ":".join(list(path_prepend) + [env["PATH"]])
        env.setdefault("HOME", home)
        sc = {**pod.spec.get("securityContext", {}), **pod.container.get("securityContext", {})}
        return {
            "hostname": pod.hostname,
            "root": os.path.join(self.workdir, pod.name + "-root"),
            "scratch": os.path.join(self.workdir, pod.name + "-volumes"),
            "mounts": self._volume_mounts(pod, shared_dir),
            "bind_dirs": list(bind_dirs),
            "read_only_root": bool(sc.get("readOnlyRootFilesystem")),
            "home": home,
            "workdir": pod.container.get("workingDir", home),
            "uid": sc.get("runAsUser", 0),
            "gid": sc.get("runAsGroup", 0),
            "groups": [g for g in [pod.spec.get("securityContext", {}).get("fsGroup")] if g is not None]
            + pod.spec.get("securityContext", {}).get("supplementalGroups", []),
            "no_new_privs": sc.get("allowPrivilegeEscalation") is False,
            "argv": pod.command + pod.args,
            "env": env,
        }

    def _volume_mounts(self, pod, shared_dir):
        """[target, kind, source, read_only, size] for each volumeMount; the PVC is shared_dir."""
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        sc = pod.spec.get("securityContext", {})
        owner = (sc.get("runAsUser", 0), sc.get("fsGroup", sc.get("runAsGroup", 0)))
        mounts = []
        for m in pod.container.get("volumeMounts", []):
            v = volumes[m["name"]]
            read_only = bool(m.get("readOnly"))
            if "persistentVolumeClaim" in v:
                # An EFS access point owns what it creates as its uid: so do we.
                src = os.path.join(shared_dir, m.get("subPath", ""))
                if not os.path.isdir(src):
                    os.makedirs(src)
                    os.chown(src, *owner)
                read_only = read_only or bool(v["persistentVolumeClaim"].get("readOnly"))
                mounts.append([m["mountPath"], "bind", src, read_only, None])
            elif "emptyDir" in v:
                if v["emptyDir"].get("medium") == "Memory":
                    mounts.append([m["mountPath"], "tmpfs", None, read_only, v["emptyDir"].get("sizeLimit")])
                else:
                    mounts.append([m["mountPath"], "emptydir", m["name"], read_only, None])
            elif "secret" in v:
                mounts.append([m["mountPath"], "bind", self._secret_dir(v["secret"]), True, None])
            elif "configMap" in v:
                mounts.append([m["mountPath"], "bind", self._config_map_dir(v["configMap"]), True, None])
            else:
                raise PodSimError(f"volume {m['name']}: {sorted(v)} is not simulated")
        return mounts

    def _secret_dir(self, secret):
        """A Secret volume's files. The Secret comes from the render when it is there; else it is
        one the operator creates by hand (like the join token): a random value per key, the same
        for every pod of this simulation."""
        name = secret["secretName"]
        d = os.path.join(self.workdir, "secrets", name)
        if not os.path.isdir(d):
            os.makedirs(d)
            try:
                rendered = find(self.objs, "Secret", name)
            except PodSimError:
                rendered = None
            data = {}
            if rendered:
                data = {k: base64.b64decode(v) for k, v in rendered.get("data", {}).items()}
                data.update({k: v.encode() for k, v in rendered.get("stringData", {}).items()})
            for item in secret.get("items", []):
                data.setdefault(item["key"], secrets.token_hex(32).encode())
            # One key may go to several paths (an MPIJob's public key: id_rsa.pub, authorized_keys).
            for item in secret.get("items") or [{"key": k, "path": k} for k in data]:
                with open(os.path.join(d, item["path"]), "wb") as f:
                    f.write(data[item["key"]])
            for f in os.listdir(d):
                os.chmod(os.path.join(d, f), 0o444)
            os.chmod(d, 0o755)
        return d

    def _config_map_dir(self, source):
        """A ConfigMap volume's files (its items, or every key), from the render."""
        name = source["name"]
        d = os.path.join(self.workdir, "configmaps", name)
        if not os.path.isdir(d):
            os.makedirs(d)
            data = find(self.objs, "ConfigMap", name).get("data", {})
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                if item["key"] not in data:
                    raise PodSimError(f"ConfigMap {name} has no key {item['key']}")
                path = os.path.join(d, item["path"])
                with open(path, "w") as f:
                    f.write(data[item["key"]])
                os.chmod(path, item.get("mode", source.get("defaultMode", 0o644)))
            os.chmod(d, 0o755)
        return d

    def _container(self, pod):
        return f"{self.prefix}{pod.hostname}"

    def _podman_argv(self, pod, shared_dir, image, home):
        """`podman run` of the real image in the pod's network namespace, with its mounts."""
        name = self._container(pod)
        self.containers.append(name)
        sc = {**pod.spec.get("securityContext", {}), **pod.container.get("securityContext", {})}
        argv = ["podman", "run", "--rm", "--name", name, "--pull=never",
                "--network", f"ns:/run/netns/{pod.netns}", "--hostname", pod.hostname, "--no-hosts",
                "-v", f"/etc/netns/{pod.netns}/hosts:/etc/hosts:ro",
                "-v", f"/etc/netns/{pod.netns}/resolv.conf:/etc/resolv.conf:ro",
                "--user", f"{sc.get('runAsUser', 0)}:{sc.get('runAsGroup', 0)}"]
        if "fsGroup" in pod.spec.get("securityContext", {}):
            argv += ["--group-add", str(pod.spec["securityContext"]["fsGroup"])]
        if sc.get("readOnlyRootFilesystem"):
            argv += ["--read-only", "--read-only-tmpfs=false"]
        if sc.get("allowPrivilegeEscalation") is False:
            argv += ["--security-opt", "no-new-privileges"]
        for cap in sc.get("capabilities", {}).get("drop", []):
            argv += ["--cap-drop", cap]
        limits = pod.container.get("resources", {}).get("limits", {})
        if "cpu" in limits:
            argv += ["--cpus", str(float(quantity_ceil(limits["cpu"], "1m")) / 1000)]
        if "memory" in limits:
            argv += ["--memory", str(int(quantity_ceil(limits["memory"])))]
        for target, kind, src, read_only, size in self._volume_mounts(pod, shared_dir):
            if kind == "bind":
                argv += ["-v", f"{src}:{target}{':ro' if read_only else ''}"]
            elif kind == "tmpfs":
                opts = f"rw,mode=1777{',size=' + str(int(quantity_ceil(size))) if size else ''}"
                if target == "/dev/shm" and size:
                    argv += ["--shm-size", str(int(quantity_ceil(size)))]
                else:
                    argv += ["--tmpfs", f"{target}:{opts}"]
            else:
                d = os.path.join(self.workdir, f"{pod.name}-volumes", src)
                os.makedirs(d, exist_ok=True)
                os.chmod(d, 0o777)  # emptyDir is world-writable
                argv += ["-v", f"{d}:{target}{':ro' if read_only else ''}"]
        for k, v in pod.env.items():
            if k != "PATH":
                argv += ["-e", f"{k}={v}"]
        argv += ["--entrypoint", pod.command[0], image] + pod.command[1:] + pod.args
        return argv


def _pump(pod, stream, log):
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        pod.output.append(line)
        log(f"[{pod.hostname}] {line}")
    stream.close()


def _killpg(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---- inside the pod's namespaces ----------------------------------------------------------------

def _mount(*args):
    r = subprocess.run(["mount", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise PodSimError(f"mount {' '.join(args)}: {r.stderr.strip()}")


def _bind(src, target, read_only, recursive=False):
    os.makedirs(target, exist_ok=True)
    _mount("--rbind" if recursive else "--bind", src, target)
    if read_only:
        _mount("-o", "remount,bind,ro", target)


def pod_init(spec_file):
    """Runs in the pod's network, UTS and mount namespaces: builds its root and execs the command."""
    with open(spec_file) as f:
        s = json.load(f)
    socket.sethostname(s["hostname"])
    root = s["root"]
    os.makedirs(root, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "mode=0755", "pod-root", root)
    # The host's /usr and /etc stand in for the image (read-only); /etc carries the netns hosts.
    for entry in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = "/" + entry
        if os.path.islink(host):
            os.symlink(os.readlink(host), os.path.join(root, entry))
        elif os.path.isdir(host):
            _bind(host, os.path.join(root, entry), True)
    _bind("/usr", root + "/usr", True)
    _bind("/etc", root + "/etc", True, recursive=True)
    _bind("/proc", root + "/proc", False, recursive=True)
    _bind("/sys", root + "/sys", True, recursive=True)
    _bind("/dev", root + "/dev", False, recursive=True)
    os.makedirs(root + s["home"], exist_ok=True)
    os.chown(root + s["home"], s["uid"], s["gid"])
    for target, kind, src, read_only, size in s["mounts"]:
        path = root + target
        if kind == "bind":
            _bind(src, path, read_only)
        elif kind == "tmpfs":
            os.makedirs(path, exist_ok=True)
            _mount("-t", "tmpfs", "-o", f"mode=1777{',size=' + quantity_ceil(size) if size else ''}",
                   "emptydir", path)
        else:
            d = os.path.join(s["scratch"], src)
            os.makedirs(d, exist_ok=True)
            os.chmod(d, 0o777)  # emptyDir is world-writable
            _bind(d, path, read_only)
    # Where the binaries under test live, at their own paths; after the volumes, so that a
    # checkout under a pod volume's mountPath (e.g. /tmp, an emptyDir) is not hidden by it.
    for d in s["bind_dirs"]:
        _bind(d, root + d, True)
    if s["read_only_root"]:
        _mount("-o", "remount,ro", root)
    os.chroot(root)
    os.chdir(s["workdir"])
    os.setgroups(s["groups"])
    os.setgid(s["gid"])
    os.setuid(s["uid"])
    if s["no_new_privs"]:
        ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    try:
        os.execvpe(s["argv"][0], s["argv"], s["env"])
    except FileNotFoundError:
        print(f"podsim: {s['argv'][0]}: not found on the pod's PATH {s['env']['PATH']}", flush=True)
        sys.exit(127)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "pod-init":
        try:
            pod_init(sys.argv[2])
        except PodSimError as e:
            print(f"podsim: pod setup failed: {e}", flush=True)
            sys.exit(125)
    else:
        print("usage: podsim.py pod-init SPEC.json (used by the tests; import it otherwise)")
        sys.exit(64)
