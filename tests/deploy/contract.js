#!/usr/bin/env node
// Checks what the schema cannot: that the rendered manifests, the eksctl cluster and the image
// agree with each other and with ddprun. An Indexed Job whose subdomain is not its Service, a
// podFailurePolicy keyed on the wrong exit codes or an eval Job reading another checkpoint
// directory all pass schema validation and fail on a cluster.
//
//   node contract.js --rendered DIR --exit-codes exit_codes.h --eksctl cluster.yaml --dockerfile Dockerfile
//   node contract.js ... --self-test   each check must catch a mutation made to break it
'use strict';
const fs = require('fs');
const path = require('path');
const YAML = require('yaml');

function parseArgs(argv) {
  const args = { selfTest: false };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    if (flag === '--self-test') args.selfTest = true;
    else if (flag.startsWith('--')) args[flag.slice(2)] = argv[++i];
  }
  for (const need of ['rendered', 'exit-codes', 'eksctl', 'dockerfile']) {
    if (!args[need]) throw new Error(`--${need} is required`);
  }
  return args;
}

function loadAll(file) {
  return YAML.parseAllDocuments(fs.readFileSync(file, 'utf8')).map((d) => d.toJS()).filter(Boolean);
}

// ddprun's exit codes, read from the header the launcher and the trainers compile against.
function readExitCodes(header) {
  const codes = {};
  for (const m of fs.readFileSync(header, 'utf8').matchAll(/constexpr int (k\w+) = (\d+);/g)) {
    codes[m[1]] = Number(m[2]);
  }
  for (const need of ['kConfig', 'kData', 'kRendezvous', 'kComm', 'kPreempted', 'kFailure']) {
    if (!(need in codes)) throw new Error(`${header} has no ${need}`);
  }
  return codes;
}

const find = (objs, kind, name) => objs.find((o) => o.kind === kind && (!name || o.metadata.name === name));
const podSpecOf = (job) => job.spec.template.spec;
const sameSet = (a, b) => a.length === b.length && a.every((x) => b.includes(x));

// The environment a container sees from env and envFrom ConfigMaps (what $(VAR) expands to).
function containerEnv(objs, container) {
  const env = {};
  for (const from of container.envFrom || []) {
    const cm = from.configMapRef && find(objs, 'ConfigMap', from.configMapRef.name);
    if (!cm) throw new Error(`envFrom ConfigMap ${JSON.stringify(from)} is not in the render`);
    Object.assign(env, cm.data);
  }
  for (const e of container.env || []) env[e.name] = e.value !== undefined ? e.value : '<valueFrom>';
  return env;
}

// Where an absolute path inside the container lives: [claimName, path inside the volume].
function volumePath(podSpec, container, file) {
  const mounts = (container.volumeMounts || []).filter(
    (m) => file === m.mountPath || file.startsWith(m.mountPath.replace(/\/$/, '') + '/'));
  if (!mounts.length) return null;
  const m = mounts.reduce((a, b) => (a.mountPath.length >= b.mountPath.length ? a : b));
  const volume = podSpec.volumes.find((v) => v.name === m.name);
  if (!volume || !volume.persistentVolumeClaim) return null;
  const inside = path.posix.join('/', m.subPath || '', path.posix.relative(m.mountPath, file));
  return [volume.persistentVolumeClaim.claimName, inside];
}

const flagValue = (args, flag) => {
  const hit = args.find((a) => a.startsWith(`${flag}=`));
  return hit && hit.slice(flag.length + 1);
};
const quantity = (q) => {
  const m = String(q).match(/^(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti)?$/);
  if (!m) throw new Error(`cannot read quantity ${q}`);
  const scale = { m: 1e-3, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40 }[m[2]] || 1;
  return Number(m[1]) * scale;
};

// ---- node groups: their architecture and what their nodes offer to pods -----------------------

// The CPU architecture of an EC2 instance type, as the kubelet labels its nodes
// (kubernetes.io/arch). Graviton families have a "g" right after the generation (c7g, c7gn,
// c7gd, m6g, r8g, t4g, im4gn, is4gen, x2gd, g5g, hpc7g), and a1 is the first Graviton; the
// rest (m6i, c6i, c5n, c6a, hpc7a, ...) are x86-64.
function archOf(instanceType) {
  const family = String(instanceType).split('.')[0];
  if (family === 'a1') return 'arm64';
  const m = family.match(/^[a-z]+\d+([a-z-]*)$/);
  if (!m) return undefined;
  return m[1].startsWith('g') ? 'arm64' : 'amd64';
}

// The instance types of k8s/eksctl/cluster.yaml (and the EFA alternative hpc7g.16xlarge): vCPUs,
// memory in GiB and EFA devices (0: no EFA) from the EC2 instance type specifications, and the
// max pods the EKS AMI gives the kubelet from the VPC CNI's ENI limits (amazon-eks-ami,
// templates/shared/runtime/eni-max-pods.txt). A new node group needs its type here.
const NODE_TYPES = {
  'm6i.large': { vcpu: 2, memoryGiB: 8, efa: 0, maxPods: 29 },
  'c6i.2xlarge': { vcpu: 8, memoryGiB: 16, efa: 0, maxPods: 58 },
  'c5n.18xlarge': { vcpu: 72, memoryGiB: 192, efa: 1, maxPods: 737 },
  'c7g.16xlarge': { vcpu: 64, memoryGiB: 128, efa: 1, maxPods: 737 },
  'c7gn.16xlarge': { vcpu: 64, memoryGiB: 128, efa: 1, maxPods: 737 },
  'hpc7g.16xlarge': { vcpu: 64, memoryGiB: 128, efa: 1, maxPods: 198 },
};
// MemTotal is below the instance's memory by what the hypervisor and kernel keep. This takes
// Karpenter's default estimate of it (vmMemoryOverheadPercent, 7.5%), which errs on the safe side
// for large instances: a pod that fits here fits on the node.
const VM_MEMORY_OVERHEAD = 0.075;
// Left free on every node for the DaemonSets' requests: kube-proxy (100m), aws-node, the EFS CSI
// node plugin, the EFA device plugin (10m, 20Mi), a monitoring agent.
const DAEMONSET_RESERVE = { cpu: 0.25, memory: 512 * 2 ** 20 };

// Huge pages a group's nodes preallocate before the kubelet starts (bytes; 0 when none).
function hugePagesOf(group) {
  const pages = (group.preBootstrapCommands || []).map((cmd) => cmd.match(/vm\.nr_hugepages=(\d+)/))
    .filter(Boolean).map((m) => Number(m[1]) * 2 ** 21);
  return pages.length ? Math.min(...pages) : 0;
}

// What a node of the group offers to pods on the EKS AL2023 AMI, as nodeadm configures the
// kubelet (amazon-eks-ami, nodeadm/internal/kubelet/config.go):
//   cpu    = vCPUs less kube-reserved: 6% of the first core, 1% of the second, 0.5% of the third
//            and fourth, 0.25% of each one above (getCPUMillicoresToReserve): c7g.16xlarge 63.77
//   memory = MemTotal less kube-reserved, 11 MiB x max pods + 255 MiB
//            (getMemoryMebibytesToReserve), less the hard eviction threshold memory.available
//            100Mi, less the preallocated huge pages, which the kubelet offers as hugepages-2Mi
//            instead: c7g.16xlarge 110.1 GiB by the estimate above, c7gn.16xlarge with 6 GiB of
//            huge pages 104.1 GiB
//   vpc.amazonaws.com/efa = the type's EFA devices where the group has efaEnabled, else none
// null for an instance type NODE_TYPES lacks.
function nodeAllocatable(group) {
  const type = NODE_TYPES[group.instanceType];
  if (!type) return null;
  const milli = type.vcpu * 1000;
  const reservedMilli = [[0, 1000, 0.06], [1000, 2000, 0.01], [2000, 4000, 0.005], [4000, Infinity, 0.0025]]
    .reduce((sum, [from, to, share]) => sum + Math.max(0, Math.min(milli, to) - from) * share, 0);
  const MiB = 2 ** 20;
  const hugepages = hugePagesOf(group);
  return {
    cpu: (milli - reservedMilli) / 1000,
    memory: type.memoryGiB * 2 ** 30 * (1 - VM_MEMORY_OVERHEAD) - (11 * type.maxPods + 255) * MiB - 100 * MiB - hugepages,
    'hugepages-2Mi': hugepages,
    'vpc.amazonaws.com/efa': group.efaEnabled ? type.efa : 0,
  };
}

// The labels a group's nodes carry: the group's own and those the kubelet sets from the instance.
const nodeLabels = (g) => ({ ...(g.labels || {}), 'kubernetes.io/arch': archOf(g.instanceType),
  'node.kubernetes.io/instance-type': g.instanceType });
const selects = (pod, g) => Object.entries(pod.nodeSelector || {}).every(([k, v]) => nodeLabels(g)[k] === v);
const tolerates = (pod, taint) => (pod.tolerations || []).some((tol) => (!tol.key || tol.key === taint.key) &&
  (!tol.effect || tol.effect === taint.effect) && (tol.operator === 'Exists' || tol.value === taint.value));
// The node groups a pod can land on: its nodeSelector matches their labels and it tolerates
// their NoSchedule and NoExecute taints.
const groupsFor = (pod, cluster) => cluster.managedNodeGroups.filter((g) => selects(pod, g) &&
  (g.taints || []).filter((t) => t.effect !== 'PreferNoSchedule').every((t) => tolerates(pod, t)));

// A pod's requests summed over its containers (requests default to limits).
function podRequests(pod) {
  const total = {};
  for (const c of pod.containers) {
    const { requests = {}, limits = {} } = c.resources || {};
    for (const [k, v] of Object.entries({ ...limits, ...requests })) total[k] = (total[k] || 0) + quantity(v);
  }
  return total;
}
const showQuantity = (k, v) => (k === 'cpu' || k === 'vpc.amazonaws.com/efa' ? `${+v.toFixed(2)}` : `${+(v / 2 ** 30).toFixed(1)}Gi`);
// What the pod asks beyond what a node offers (less the DaemonSets' share): [] when it fits.
function shortfalls(need, allocatable) {
  return Object.entries(need).filter(([k]) => k in allocatable).flatMap(([k, v]) => {
    const free = allocatable[k] - (DAEMONSET_RESERVE[k] || 0);
    return v > free + 1e-9 ? [`${k} ${showQuantity(k, v)} > ${showQuantity(k, Math.max(free, 0))}`] : [];
  });
}

// ---- the checks: each returns a list of problems (empty = holds) -------------------------------

function checkIndexedJob(objs, codes) {
  const problems = [];
  const job = find(objs, 'Job', 'ddp-train');
  const svc = find(objs, 'Service', podSpecOf(job).subdomain);
  const pod = podSpecOf(job);
  const trainer = pod.containers[0];
  const env = containerEnv(objs, trainer);
  const nodes = Number(env.NODES);
  if (job.spec.completionMode !== 'Indexed') problems.push('completionMode is not Indexed');
  if (!(job.spec.completions === nodes && job.spec.parallelism === nodes)) {
    problems.push(`completions ${job.spec.completions} / parallelism ${job.spec.parallelism} != NODES ${env.NODES}`);
  }
  if (!svc) problems.push(`subdomain ${pod.subdomain} names no Service in the render`);
  else {
    if (svc.spec.clusterIP !== 'None') problems.push(`Service ${svc.metadata.name} is not headless`);
    if (!svc.spec.publishNotReadyAddresses) problems.push('Service does not publish not-ready addresses');
    const labels = job.spec.template.metadata.labels || {};
    for (const [k, v] of Object.entries(svc.spec.selector || {})) {
      if (labels[k] !== v) problems.push(`Service selector ${k}=${v} does not match the pod labels`);
    }
  }
  if (pod.restartPolicy !== 'Never') problems.push('restartPolicy is not Never');
  if (!(job.spec.backoffLimitPerIndex >= 0)) problems.push('backoffLimitPerIndex is not set');
  if (trainer.command[0] !== 'ddprun') problems.push(`command is ${trainer.command}, not ddprun`);
  if (flagValue(trainer.args, '--nnodes') !== '$(NODES)') problems.push('ddprun is not given --nnodes=$(NODES)');
  for (const arg of [...trainer.command, ...trainer.args]) {
    for (const m of arg.matchAll(/\$\((\w+)\)/g)) {
      if (!(m[1] in env)) problems.push(`${arg} uses $(${m[1]}), which the container's environment lacks`);
    }
  }
  problems.push(...checkFailurePolicy(job, trainer.name, codes));
  return problems;
}

function checkFailurePolicy(job, containerName, codes) {
  const problems = [];
  const rules = (job.spec.podFailurePolicy || {}).rules || [];
  const codesFor = (action) => rules
    .filter((r) => r.action === action && r.onExitCodes && r.onExitCodes.operator === 'In')
    .flatMap((r) => {
      if (r.onExitCodes.containerName !== containerName) {
        problems.push(`an ${action} rule names container ${r.onExitCodes.containerName}, not ${containerName}`);
      }
      return r.onExitCodes.values;
    });
  if (!sameSet(codesFor('FailJob'), [codes.kConfig, codes.kData])) {
    problems.push(`FailJob exit codes ${codesFor('FailJob')} != config and data errors ${[codes.kConfig, codes.kData]}`);
  }
  if (!sameSet(codesFor('Ignore'), [codes.kPreempted])) {
    problems.push(`Ignore exit codes ${codesFor('Ignore')} != preempted ${codes.kPreempted}`);
  }
  const disruption = rules.some((r) => r.action === 'Ignore' &&
    (r.onPodConditions || []).some((c) => c.type === 'DisruptionTarget'));
  if (!disruption) problems.push('disruptions (DisruptionTarget) are not ignored');
  return problems;
}

// The free room ddprun doctor (and ddprun --preflight) requires in /dev/shm for a node's ranks,
// unless DDP_DOCTOR_SHM_BYTES says otherwise: 64 MiB per rank, at least 256 MiB
// (launcher/doctor/doctor_report.cpp, default_shm_min_bytes).
const doctorShmMinBytes = (ranks) => Math.max(256 * 2 ** 20, 64 * 2 ** 20 * ranks);
const showMiB = (bytes) => `${+(bytes / 2 ** 20).toFixed(1)} MiB`;

// A ddprun container's /dev/shm against what the doctor asks of it: the memory-backed emptyDir's
// sizeLimit (the kubelet sizes its tmpfs so) at least the doctor's minimum for NPROC_PER_NODE
// ranks, or DDP_DOCTOR_SHM_BYTES where the container sets it; and at most the container's memory
// limit, since the tmpfs pages are charged to the memory cgroup of the container that writes
// them, so a sizeLimit above it only moves the failure from the doctor to the OOM killer. A
// missing sizeLimit is taken as the memory limit, what the kubelet mounts then.
function checkShmSize(where, c, vol, env) {
  const problems = [];
  const limit = ((c.resources || {}).limits || {}).memory;
  const size = vol.emptyDir.sizeLimit !== undefined ? quantity(vol.emptyDir.sizeLimit) : limit && quantity(limit);
  const shown = vol.emptyDir.sizeLimit !== undefined ? `sizeLimit ${vol.emptyDir.sizeLimit}` : `no sizeLimit (memory limit ${limit})`;
  let need;
  let why;
  const override = env.DDP_DOCTOR_SHM_BYTES;
  if (override !== undefined) {
    if (override === '<valueFrom>') return problems;   // known only on the cluster
    if (!/^\d+$/.test(String(override))) {
      problems.push(`${where}/${c.name}: DDP_DOCTOR_SHM_BYTES=${override} is not a whole number of bytes, which ddprun refuses`);
      return problems;
    }
    need = Number(override);
    why = `DDP_DOCTOR_SHM_BYTES ${override}`;
  } else if (env.NPROC_PER_NODE) {
    need = doctorShmMinBytes(Number(env.NPROC_PER_NODE));
    why = `ddprun doctor's ${showMiB(need)} for NPROC_PER_NODE ${env.NPROC_PER_NODE} (64 MiB a rank, at least 256 MiB)`;
  }
  if (need !== undefined && !(size >= need)) {
    problems.push(`${where}/${c.name}: /dev/shm emptyDir ${vol.name} has ${shown} (${showMiB(size)}), below ${why}`);
  }
  if (vol.emptyDir.sizeLimit !== undefined && limit && size > quantity(limit)) {
    problems.push(`${where}/${c.name}: /dev/shm emptyDir ${vol.name} sizeLimit ${vol.emptyDir.sizeLimit} is above the ` +
      `memory limit ${limit} it is charged to`);
  }
  return problems;
}

// Every container: requests = limits (Guaranteed QoS), CPU and memory set, non-root, and for the
// trainer no more threads (ranks x OMP_NUM_THREADS, which must be set) than CPUs and a
// memory-backed /dev/shm with the room ddprun doctor wants for its ranks (checkShmSize).
function checkPods(podSpecs) {
  const problems = [];
  for (const [where, pod, objs] of podSpecs) {
    const sc = pod.securityContext || {};
    if (!(sc.runAsNonRoot && sc.runAsUser > 0)) problems.push(`${where}: not forced to run as non-root`);
    for (const c of pod.containers) {
      const { requests = {}, limits = {} } = c.resources || {};
      if (!(requests.cpu && requests.memory)) problems.push(`${where}/${c.name}: cpu or memory unset`);
      const keys = new Set([...Object.keys(requests), ...Object.keys(limits)]);
      for (const k of keys) {
        if (String(requests[k]) !== String(limits[k])) {
          problems.push(`${where}/${c.name}: ${k} request ${requests[k]} != limit ${limits[k]}`);
        }
      }
      const env = containerEnv(objs, c);
      if (env.NPROC_PER_NODE) {
        const threads = Number(env.NPROC_PER_NODE) * Number(env.OMP_NUM_THREADS);
        if (!(threads <= quantity(limits.cpu))) {
          problems.push(`${where}/${c.name}: NPROC_PER_NODE ${env.NPROC_PER_NODE} x OMP_NUM_THREADS ` +
            `${env.OMP_NUM_THREADS} > CPU limit ${limits.cpu}`);
        }
      }
      // ddprun itself, or behind a wrapper that runs it (overlays/export: ddp-export-model ... -- ddprun).
      if ((c.command || []).includes('ddprun')) {
        const shm = (c.volumeMounts || []).find((m) => m.mountPath === '/dev/shm');
        const vol = shm && pod.volumes.find((v) => v.name === shm.name);
        if (!(vol && vol.emptyDir && vol.emptyDir.medium === 'Memory')) {
          problems.push(`${where}/${c.name}: /dev/shm is not a memory-backed emptyDir`);
        } else {
          problems.push(...checkShmSize(where, c, vol, env));
        }
      }
    }
  }
  return problems;
}

// Data prep writes where training reads, and eval reads where training writes checkpoints.
function checkSharedVolume(r) {
  const problems = [];
  const trainJob = find(r.base, 'Job', 'ddp-train');
  const trainPod = podSpecOf(trainJob);
  const trainer = trainPod.containers[0];
  const afterProgram = (c) => c.args.slice(c.args.findIndex((a) => !a.startsWith('--')));
  const trainData = volumePath(trainPod, trainer, flagValue(afterProgram(trainer), '--data'));
  const trainCkpt = volumePath(trainPod, trainer, flagValue(afterProgram(trainer), '--checkpoint-dir'));
  if (!trainData || !trainCkpt) return ['training --data or --checkpoint-dir is not on a PVC'];

  const prepPod = podSpecOf(find(r['data-prep'], 'Job'));
  const prep = prepPod.containers[0];
  const staged = volumePath(prepPod, prep, flagValue(prep.args, '--dest'));
  if (String(staged) !== String(trainData)) problems.push(`data prep stages into ${staged}, training reads ${trainData}`);
  const created = prep.args.filter((a) => a.startsWith('--create-dir=')).map(
    (a) => String(volumePath(prepPod, prep, a.slice('--create-dir='.length))));
  const ckptDir = [trainCkpt[0], path.posix.dirname(trainCkpt[1])];
  if (!created.includes(String(ckptDir))) problems.push(`data prep does not create the checkpoint parent ${ckptDir}`);

  const evalPod = podSpecOf(find(r.eval, 'Job'));
  const evaluator = evalPod.containers[0];
  const evalData = volumePath(evalPod, evaluator, flagValue(evaluator.args, '--data'));
  const evalCkpt = volumePath(evalPod, evaluator, flagValue(evaluator.args, '--checkpoint'));
  if (String(evalData) !== String(trainData)) problems.push(`eval reads data ${evalData}, training ${trainData}`);
  if (String(evalCkpt) !== String(trainCkpt)) problems.push(`eval reads checkpoints ${evalCkpt}, training writes ${trainCkpt}`);

  const pvc = find(r.efs, 'PersistentVolumeClaim', trainData[0]);
  if (!pvc) problems.push(`storage/efs has no claim ${trainData[0]}`);
  else {
    if (!pvc.spec.accessModes.includes('ReadWriteMany')) problems.push(`${pvc.metadata.name} is not ReadWriteMany`);
    const sc = find(r.efs, 'StorageClass', pvc.spec.storageClassName);
    if (!sc || sc.provisioner !== 'efs.csi.aws.com') problems.push('the claim is not provisioned by the EFS CSI driver');
    else if (Number(sc.parameters.uid) !== trainPod.securityContext.runAsUser) {
      problems.push(`EFS access points belong to uid ${sc.parameters.uid}, the pods run as ${trainPod.securityContext.runAsUser}`);
    }
  }
  return problems;
}

// The EFA overlays (efa, graviton-efa): libfabric's efa provider, an EFA device and huge pages,
// on an efaEnabled node group their nodeSelector picks, whose taints they tolerate and whose
// nodes preallocate (and tell the autoscaler of) the huge pages they request.
function checkEfa(r, cluster) {
  return ['efa', 'graviton-efa'].flatMap((name) => checkEfaPods(name, r[name], cluster));
}

function checkEfaPods(name, objs, cluster) {
  const problems = [];
  const job = find(objs, 'Job', 'ddp-train');
  const pod = podSpecOf(job);
  const c = pod.containers[0];
  const env = containerEnv(objs, c);
  if (env.DDP_BACKEND !== 'fabric') problems.push(`${name}: DDP_BACKEND is ${env.DDP_BACKEND}, not fabric`);
  if (env.FI_PROVIDER !== 'efa') problems.push(`${name}: FI_PROVIDER is ${env.FI_PROVIDER}, not efa`);
  const limits = c.resources.limits;
  if (!(Number(limits['vpc.amazonaws.com/efa']) >= 1)) problems.push(`${name}: no vpc.amazonaws.com/efa device requested`);
  if (!limits['hugepages-2Mi']) problems.push(`${name}: no hugepages-2Mi requested`);
  const groups = cluster.managedNodeGroups.filter((g) => g.efaEnabled && selects(pod, g));
  if (!groups.length) {
    return [...problems, `${name}: no EFA node group in the eksctl config has the labels ${JSON.stringify(pod.nodeSelector || {})}`];
  }
  for (const group of groups) {
    for (const t of group.taints || []) {
      const tolerated = (pod.tolerations || []).some((tol) => tol.key === t.key && tol.effect === t.effect &&
        (tol.operator === 'Exists' || tol.value === t.value));
      if (!tolerated) problems.push(`${name}: the EFA group ${group.name}'s taint ${t.key}:${t.effect} is not tolerated`);
    }
    const tags = group.tags || {};
    const hugeTag = tags['k8s.io/cluster-autoscaler/node-template/resources/hugepages-2Mi'];
    if (!hugeTag || quantity(hugeTag) < quantity(limits['hugepages-2Mi'])) {
      problems.push(`${name}: ${group.name}'s autoscaler template huge pages ${hugeTag} < requested ${limits['hugepages-2Mi']}`);
    }
    const preallocated = hugePagesOf(group);
    if (preallocated < quantity(limits['hugepages-2Mi'])) {
      problems.push(`${name}: ${group.name}'s nodes preallocate ${preallocated} bytes of huge pages, pods request ${limits['hugepages-2Mi']}`);
    }
  }
  return problems;
}

function checkCluster(cluster) {
  const problems = [];
  const name = cluster.metadata.name;
  if (!(cluster.iam && cluster.iam.withOIDC)) problems.push('OIDC (IAM roles for service accounts) is off');
  if (!(cluster.addons || []).some((a) => a.name === 'aws-efs-csi-driver')) problems.push('no EFS CSI driver add-on');
  for (const g of cluster.managedNodeGroups) {
    const tags = g.tags || {};
    if (g.minSize < g.maxSize) {
      if (tags['k8s.io/cluster-autoscaler/enabled'] !== 'true' || !(`k8s.io/cluster-autoscaler/${name}` in tags)) {
        problems.push(`node group ${g.name} scales but lacks the autoscaler's discovery tags`);
      }
      for (const [k, v] of Object.entries(g.labels || {})) {
        if (tags[`k8s.io/cluster-autoscaler/node-template/label/${k}`] !== v) {
          problems.push(`node group ${g.name}: label ${k} has no autoscaler node-template tag`);
        }
      }
      for (const t of g.taints || []) {
        if (tags[`k8s.io/cluster-autoscaler/node-template/taint/${t.key}`] !== `${t.value}:${t.effect}`) {
          problems.push(`node group ${g.name}: taint ${t.key} has no autoscaler node-template tag`);
        }
      }
    }
    if (g.efaEnabled) {
      if (!(g.availabilityZones && g.availabilityZones.length === 1)) problems.push(`EFA group ${g.name} spans several AZs`);
      if (!(g.placement && g.placement.groupName)) problems.push(`EFA group ${g.name} has no placement group`);
      if (tags['k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa'] === undefined) {
        problems.push(`EFA group ${g.name} cannot scale from zero: no EFA node-template tag`);
      }
    }
    const type = NODE_TYPES[g.instanceType];
    if (!type || !archOf(g.instanceType)) {
      problems.push(`node group ${g.name}: instance type ${g.instanceType} is not in NODE_TYPES (contract.js): ` +
        'add its vCPUs, memory, EFA devices and max pods, so that the pods\' fit can be checked');
    } else if (g.efaEnabled && !(type.efa > 0)) {
      problems.push(`EFA group ${g.name}: ${g.instanceType} has no EFA device`);
    }
  }
  return problems;
}

// Where each pod can run. A kubernetes.io/arch selector (never an instance name) names the
// architecture of some node group, and with node groups of both architectures every pod names
// one: an image built for one fails on the other ("exec format error"). A pod that asks for
// EFA devices reaches only efaEnabled groups. Its requests fit what a node of a group it reaches
// offers (nodeAllocatable less the DaemonSets' share), and that group, where it scales from
// zero, tells the autoscaler every label the pod selects. `pods`: [where, pod spec].
function checkScheduling(pods, cluster) {
  const problems = [];
  const groups = cluster.managedNodeGroups;
  const arches = [...new Set(groups.map((g) => archOf(g.instanceType)).filter(Boolean))].sort();
  for (const [where, pod] of pods) {
    const selector = pod.nodeSelector || {};
    for (const key of ['node.kubernetes.io/instance-type', 'beta.kubernetes.io/instance-type']) {
      if (key in selector) {
        problems.push(`${where}: selects its nodes by instance name (${key}: ${selector[key]}); ` +
          'select kubernetes.io/arch and ddprun/pool instead');
      }
    }
    const arch = selector['kubernetes.io/arch'];
    if (arch === undefined) {
      if (arches.length > 1) problems.push(`${where}: no kubernetes.io/arch selector, and the node groups are ${arches.join(' and ')}`);
    } else if (!['amd64', 'arm64'].includes(arch)) {
      problems.push(`${where}: kubernetes.io/arch: ${arch} is neither amd64 nor arm64`);
    } else if (!arches.includes(arch)) {
      problems.push(`${where}: selects kubernetes.io/arch: ${arch}, but no eksctl node group is ${arch} (` +
        `${groups.map((g) => `${g.name} ${g.instanceType} ${archOf(g.instanceType)}`).join(', ')})`);
    }
    const reachable = groupsFor(pod, cluster);
    if (!reachable.length) {
      problems.push(`${where}: no node group has the labels ${JSON.stringify(selector)} and only taints the pod tolerates`);
      continue;
    }
    const need = podRequests(pod);
    if (need['vpc.amazonaws.com/efa'] > 0) {
      const plain = reachable.filter((g) => !g.efaEnabled);
      if (plain.length) {
        problems.push(`${where}: requests EFA devices, but its selector also reaches node groups without ` +
          `efaEnabled: ${plain.map((g) => g.name).join(', ')}`);
      }
    }
    const verdicts = reachable.map((g) => {
      const allocatable = nodeAllocatable(g);
      return [g, allocatable ? shortfalls(need, allocatable) : ['no allocatable figures for its instance type']];
    });
    const fitting = verdicts.filter(([, short]) => !short.length).map(([g]) => g);
    if (!fitting.length) {
      problems.push(`${where}: its requests (${Object.entries(need).map(([k, v]) => `${k} ${showQuantity(k, v)}`).join(', ')}) ` +
        `fit no node group it reaches: ${verdicts.map(([g, short]) => `${g.name} (${g.instanceType}): ${short.join(', ')}`).join('; ')}`);
    }
    for (const g of fitting.filter((x) => x.minSize === 0)) {
      const tags = g.tags || {};
      for (const [k, v] of Object.entries(selector)) {
        if ((g.labels || {})[k] !== v && tags[`k8s.io/cluster-autoscaler/node-template/label/${k}`] !== v) {
          problems.push(`${where}: node group ${g.name} scales from zero, but no node-template tag tells the ` +
            `autoscaler its nodes have ${k}: ${v}, which the pod selects`);
        }
      }
    }
  }
  return problems;
}

// The PyTorchJob runs the same program with the same flags as the Indexed Job (minus --nnodes:
// the operator's WORLD_SIZE says it), and has NODES pods.
function checkPyTorchJob(r) {
  const problems = [];
  const job = find(r.pytorchjob, 'PyTorchJob');
  const base = podSpecOf(find(r.base, 'Job', 'ddp-train')).containers[0];
  const specs = job.spec.pytorchReplicaSpecs;
  const pods = Object.values(specs).reduce((n, s) => n + s.replicas, 0);
  const env = containerEnv(r.pytorchjob, specs.Master.template.spec.containers[0]);
  if (specs.Master.replicas !== 1) problems.push('Master replicas != 1');
  if (pods !== Number(env.NODES)) problems.push(`Master + Worker replicas ${pods} != NODES ${env.NODES}`);
  const expected = base.args.filter((a) => !a.startsWith('--nnodes='));
  for (const [type, spec] of Object.entries(specs)) {
    const c = spec.template.spec.containers.find((x) => x.name === 'pytorch');
    if (JSON.stringify(c.command) !== JSON.stringify(base.command)) problems.push(`${type}: command differs from the Job's`);
    if (JSON.stringify(c.args) !== JSON.stringify(expected)) problems.push(`${type}: args ${c.args} differ from the Job's ${expected}`);
    if (c.image !== base.image) problems.push(`${type}: image ${c.image} != ${base.image}`);
    if (JSON.stringify(c.volumeMounts) !== JSON.stringify(base.volumeMounts)) problems.push(`${type}: volume mounts differ from the Job's`);
  }
  return problems;
}

// Every ddprun pod reads its join token from the Secret volume mounted where
// DDPRUN_RDZV_TOKEN_FILE points, and a NetworkPolicy of the same render admits the pod's own
// job (and so its store port) by the pod's labels.
function checkJoinToken(pods) {
  const problems = [];
  for (const [where, podSpec, objs, labels] of pods) {
    const c = podSpec.containers[0];
    const file = containerEnv(objs, c).DDPRUN_RDZV_TOKEN_FILE;
    if (!file) {
      problems.push(`${where}: no DDPRUN_RDZV_TOKEN_FILE: the store would admit any agent`);
      continue;
    }
    const mount = (c.volumeMounts || []).find((m) => file.startsWith(m.mountPath.replace(/\/?$/, '/')));
    const volume = mount && (podSpec.volumes || []).find((v) => v.name === mount.name);
    if (!volume || !volume.secret) {
      problems.push(`${where}: ${file} is not on a Secret volume`);
      continue;
    }
    const inside = file.slice(mount.mountPath.replace(/\/?$/, '/').length);
    const items = volume.secret.items || [];
    if (items.length && !items.some((i) => i.path === inside)) {
      problems.push(`${where}: the Secret volume has no item at ${inside}`);
    }
    const matches = (selector) => Object.entries(selector.matchLabels || {})
      .every(([k, v]) => labels[k] === v);
    const policy = objs.find((o) => o.kind === 'NetworkPolicy' && matches(o.spec.podSelector));
    if (!policy) {
      problems.push(`${where}: no NetworkPolicy selects the pods`);
    } else if (!(policy.spec.ingress || []).some((rule) => (rule.from || [])
      .some((peer) => peer.podSelector && !peer.namespaceSelector && matches(peer.podSelector)))) {
      problems.push(`${where}: NetworkPolicy ${policy.metadata.name} does not admit the job's own pods`);
    }
  }
  return problems;
}

function checkImageUser(r, dockerfile) {
  // Every stage that ends as a non-root image (the runtime image and its mpi target).
  const users = [...fs.readFileSync(dockerfile, 'utf8').matchAll(/^USER (\d+)(?::(\d+))?$/gm)].map((m) => Number(m[1]));
  const runAs = podSpecOf(find(r.base, 'Job', 'ddp-train')).securityContext.runAsUser;
  const mpi = Object.values(find(r.mpijob, 'MPIJob').spec.mpiReplicaSpecs)
    .map((s) => s.template.spec.securityContext.runAsUser);
  const wrong = [runAs, ...mpi].filter((u) => users.length === 0 || users.some((x) => x !== u));
  return wrong.length === 0 ? [] : [`the image's USER ${users.join(', ')} != the pods' runAsUser ${wrong.join(', ')}`];
}

// The model export (jobs/export, and overlays/export: the training with the export as its last
// step): the pods' ServiceAccount is the eksctl IRSA entry (name, namespace, role name; eksctl
// creates only the role, so kubectl's annotation is not overwritten), whose policy lets it list
// the bucket and write under the prefix of DDP_EXPORT_S3_URI; the export reads the checkpoint
// directory and dataset training uses; the overlay runs the base's training unchanged.
function checkExport(r, cluster, codes) {
  const problems = [];
  const trainPod = podSpecOf(find(r.base, 'Job', 'ddp-train'));
  const trainer = trainPod.containers[0];
  const afterProgram = (args) => args.slice(args.findIndex((a) => !a.startsWith('--')));
  const trainCkpt = volumePath(trainPod, trainer, flagValue(afterProgram(trainer.args), '--checkpoint-dir'));
  const trainData = volumePath(trainPod, trainer, flagValue(afterProgram(trainer.args), '--data'));
  const covers = (resources, arn) => [].concat(resources || []).some((res) =>
    new RegExp(`^${res.split('*').map((s) => s.replace(/[.?+^$[\]\\(){}|/-]/g, '\\$&')).join('.*')}$`).test(arn));
  const allows = (statements, action, arn) => statements.some((s) => s.Effect === 'Allow' &&
    [].concat(s.Action).some((a) => a === action || a === 's3:*' || a === '*') && covers(s.Resource, arn));
  const pods = [['export', find(r.export, 'Job', 'ddp-export'), 'export', r.export],
    ['export-train', find(r['export-train'], 'Job', 'ddp-train'), 'trainer', r['export-train']]];
  for (const [where, job, containerName, objs] of pods) {
    const pod = podSpecOf(job);
    const c = pod.containers.find((x) => x.name === containerName);
    if (!c) {
      problems.push(`${where}: no container ${containerName}`);
      continue;
    }
    const sa = find(objs, 'ServiceAccount', pod.serviceAccountName);
    if (!sa) {
      problems.push(`${where}: serviceAccountName ${pod.serviceAccountName} names no ServiceAccount in the render`);
      continue;
    }
    const ns = sa.metadata.namespace || 'default';
    const entry = ((cluster.iam || {}).serviceAccounts || []).find(
      (s) => s.metadata.name === sa.metadata.name && (s.metadata.namespace || 'default') === ns);
    if (!entry) {
      problems.push(`${where}: ServiceAccount ${ns}/${sa.metadata.name} has no iam.serviceAccounts entry in the eksctl config`);
      continue;
    }
    const arn = (sa.metadata.annotations || {})['eks.amazonaws.com/role-arn'] || '';
    if (!entry.roleName || !arn.endsWith(`:role/${entry.roleName}`)) {
      problems.push(`${where}: role-arn annotation ${arn} does not name the eksctl role ${entry.roleName}`);
    }
    if (entry.roleOnly !== true) problems.push(`${where}: the eksctl entry is not roleOnly: eksctl and kubectl would both write the ServiceAccount`);
    const uri = containerEnv(objs, c).DDP_EXPORT_S3_URI || '';
    const m = uri.match(/^s3:\/\/([^/]+)\/?(.*?)\/?$/);
    if (!m) {
      problems.push(`${where}: DDP_EXPORT_S3_URI ${uri} is not s3://BUCKET/PREFIX`);
    } else {
      const statements = ((entry.attachPolicy || {}).Statement || []);
      const object = `arn:aws:s3:::${m[1]}/${m[2] ? `${m[2]}/` : ''}model.pt`;
      if (!allows(statements, 's3:ListBucket', `arn:aws:s3:::${m[1]}`)) problems.push(`${where}: the role may not list bucket ${m[1]} (head-bucket)`);
      for (const action of ['s3:PutObject', 's3:GetObject']) {
        if (!allows(statements, action, object)) problems.push(`${where}: the role lacks ${action} under ${uri}`);
      }
    }
    const cmd = [...c.command, ...(c.args || [])];
    const exportArgs = cmd.includes('--') ? cmd.slice(0, cmd.indexOf('--')) : cmd;
    if (exportArgs[0] !== 'ddp-export-model') problems.push(`${where}: runs ${exportArgs[0]}, not ddp-export-model`);
    const ckpt = volumePath(pod, c, flagValue(exportArgs, '--checkpoint-dir') || '');
    const data = volumePath(pod, c, flagValue(exportArgs, '--data') || '');
    if (String(ckpt) !== String(trainCkpt)) problems.push(`${where}: exports from ${ckpt}, training writes ${trainCkpt}`);
    if (String(data) !== String(trainData)) problems.push(`${where}: evaluates on ${data}, training reads ${trainData}`);
    if (cmd.includes('--')) {
      const wrapped = cmd.slice(cmd.indexOf('--') + 1);
      const base = [...trainer.command, ...trainer.args];
      if (JSON.stringify(wrapped) !== JSON.stringify(base)) problems.push(`${where}: runs ${wrapped.join(' ')}, not the Job's ${base.join(' ')}`);
    }
  }
  // ddp-export-model's codes are ddprun's: bad configuration and no valid checkpoint fail at once.
  const failJob = ((pods[0][1].spec.podFailurePolicy || {}).rules || [])
    .filter((x) => x.action === 'FailJob' && x.onExitCodes && x.onExitCodes.containerName === 'export')
    .flatMap((x) => x.onExitCodes.values);
  if (!sameSet(failJob, [codes.kConfig, codes.kData])) {
    problems.push(`export: FailJob exit codes ${failJob} != config and data errors ${[codes.kConfig, codes.kData]}`);
  }
  return problems;
}

// ddprun's metrics port (PET_METRICS_PORT) is the one the pods announce, expose, admit through
// their NetworkPolicy and a PodMonitor scrapes. `templates`: [where, pod template, its render].
function checkMetrics(templates) {
  const problems = [];
  for (const [where, template, objs] of templates) {
    const c = template.spec.containers[0];
    const port = containerEnv(objs, c).PET_METRICS_PORT;
    if (!port) {
      problems.push(`${where}: no PET_METRICS_PORT: ddprun serves no metrics`);
      continue;
    }
    const notes = template.metadata.annotations || {};
    if (notes['prometheus.io/scrape'] !== 'true' || notes['prometheus.io/port'] !== port) {
      problems.push(`${where}: prometheus.io annotations (scrape ${notes['prometheus.io/scrape']}, port ` +
        `${notes['prometheus.io/port']}) do not announce port ${port}`);
    }
    const named = (c.ports || []).find((p) => p.name === 'metrics');
    if (!named || String(named.containerPort) !== port) {
      problems.push(`${where}: container port "metrics" is ${named && named.containerPort}, not ${port}`);
    }
    const labels = template.metadata.labels || {};
    const matches = (selector) => Object.entries((selector || {}).matchLabels || {})
      .every(([k, v]) => labels[k] === v);
    const policy = objs.find((o) => o.kind === 'NetworkPolicy' && matches(o.spec.podSelector));
    const admitted = policy && (policy.spec.ingress || []).some((rule) =>
      (rule.ports || []).some((p) => String(p.port) === port) &&
      (rule.from || []).some((peer) => peer.podSelector &&
        (peer.podSelector.matchLabels || {})['app.kubernetes.io/name'] === 'prometheus'));
    if (!admitted) problems.push(`${where}: no NetworkPolicy rule admits Prometheus on port ${port}`);
    for (const monitor of objs.filter((o) => o.kind === 'PodMonitor')) {
      if (!matches(monitor.spec.selector)) {
        problems.push(`${where}: PodMonitor ${monitor.metadata.name} does not select the pods`);
      }
      for (const e of monitor.spec.podMetricsEndpoints || []) {
        if (!(c.ports || []).some((p) => p.name === e.port && String(p.containerPort) === port)) {
          problems.push(`${where}: PodMonitor scrapes port "${e.port}", not the metrics port ${port}`);
        }
      }
    }
  }
  return problems;
}

// ddprun's health port (TORCHELASTIC_HEALTH_CHECK_PORT) is the one the pod names "health" and
// its liveness probe asks, on a path the agent answers. `templates`: [where, pod template, render].
function checkHealth(templates) {
  const problems = [];
  for (const [where, template, objs] of templates) {
    const c = template.spec.containers[0];
    const port = containerEnv(objs, c).TORCHELASTIC_HEALTH_CHECK_PORT;
    if (!port) {
      problems.push(`${where}: no TORCHELASTIC_HEALTH_CHECK_PORT: ddprun serves no health endpoint`);
      continue;
    }
    const named = (c.ports || []).find((p) => p.name === 'health');
    if (!named || String(named.containerPort) !== port) {
      problems.push(`${where}: container port "health" is ${named && named.containerPort}, not ${port}`);
    }
    const get = (c.livenessProbe || {}).httpGet;
    if (!get) {
      problems.push(`${where}: no liveness probe asks the health endpoint`);
      continue;
    }
    if (!(get.port === 'health' || String(get.port) === port)) {
      problems.push(`${where}: the liveness probe asks port ${get.port}, not the health port ${port}`);
    }
    if (!['/', '/health', '/healthz'].includes(get.path)) {
      problems.push(`${where}: the liveness probe asks ${get.path}, which ddprun does not answer`);
    }
  }
  return problems;
}

// Gang scheduling: Volcano's PodGroup is the Job's pods (minMember = parallelism, linked by the
// group-name annotation, scheduled by Volcano); Kueue's Job waits suspended in a LocalQueue whose
// ClusterQueue can hold the whole Job at once.
function checkGangScheduling(r) {
  const problems = [];
  const vJob = find(r.volcano, 'Job', 'ddp-train');
  const group = find(r.volcano, 'PodGroup');
  const template = vJob.spec.template;
  if (template.spec.schedulerName !== 'volcano') problems.push('volcano: the pods are not scheduled by volcano');
  if ((template.metadata.annotations || {})['scheduling.k8s.io/group-name'] !== group.metadata.name) {
    problems.push(`volcano: the pods' group-name annotation does not name PodGroup ${group.metadata.name}`);
  }
  if (group.spec.minMember !== vJob.spec.parallelism) {
    problems.push(`volcano: PodGroup minMember ${group.spec.minMember} != the Job's ${vJob.spec.parallelism} pods`);
  }
  const kJob = find(r.kueue, 'Job', 'ddp-train');
  if (kJob.spec.suspend !== true) problems.push('kueue: the Job is not created suspended');
  const queueName = (kJob.metadata.labels || {})['kueue.x-k8s.io/queue-name'];
  const local = find(r.kueue, 'LocalQueue', queueName);
  const cq = local && find(r.kueue, 'ClusterQueue', local.spec.clusterQueue);
  if (!local || !cq) {
    problems.push(`kueue: queue-name ${queueName} names no LocalQueue with its ClusterQueue in the render`);
    return problems;
  }
  const limits = kJob.spec.template.spec.containers[0].resources.requests;
  const need = { cpu: quantity(limits.cpu) * kJob.spec.parallelism,
    memory: quantity(limits.memory) * kJob.spec.parallelism, pods: kJob.spec.parallelism };
  for (const [resource, amount] of Object.entries(need)) {
    const quota = cq.spec.resourceGroups.flatMap((g) => g.flavors).flatMap((f) => f.resources)
      .filter((q) => q.name === resource).reduce((sum, q) => sum + quantity(q.nominalQuota), 0);
    if (quota < amount) problems.push(`kueue: ClusterQueue ${cq.metadata.name} has ${quota} ${resource}, the Job needs ${amount}`);
  }
  for (const f of cq.spec.resourceGroups.flatMap((g) => g.flavors)) {
    if (!find(r.kueue, 'ResourceFlavor', f.name)) problems.push(`kueue: flavor ${f.name} is not in the render`);
  }
  return problems;
}

// The MPIJob runs the Job's program with its flags on replicas x slotsPerWorker ranks.
function checkMpiJob(r) {
  const problems = [];
  const job = find(r.mpijob, 'MPIJob');
  const launcher = job.spec.mpiReplicaSpecs.Launcher.template.spec.containers[0];
  const workers = job.spec.mpiReplicaSpecs.Worker;
  const np = Number(launcher.args[launcher.args.indexOf('-np') + 1]);
  if (np !== workers.replicas * job.spec.slotsPerWorker) {
    problems.push(`mpijob: mpirun -np ${np} != ${workers.replicas} workers x ${job.spec.slotsPerWorker} slots`);
  }
  const base = podSpecOf(find(r.base, 'Job', 'ddp-train')).containers[0].args;
  const program = base.slice(base.findIndex((a) => !a.startsWith('--')));
  const mine = launcher.args.slice(launcher.args.indexOf(program[0]));
  if (JSON.stringify(mine) !== JSON.stringify(program)) {
    problems.push(`mpijob: runs ${mine.join(' ')}, not the Job's ${program.join(' ')}`);
  }
  // The ranks run on the workers, which lack the launcher's hostfile: mpirun must hand them
  // rank 0's host, the hostfile's first, and pass the args list on ("$@").
  const shell = (launcher.command || []).join(' ');
  if (!/-x MASTER_ADDR=.*\$OMPI_MCA_orte_default_hostfile/.test(shell) || !shell.includes('"$@"')) {
    problems.push(`mpijob: the launcher does not pass MASTER_ADDR from the hostfile to the ranks (command: ${shell})`);
  }
  for (const [type, spec] of Object.entries(job.spec.mpiReplicaSpecs)) {
    const image = spec.template.spec.containers[0].image;
    if (!/^(.*\/)?ddprun-mpi(:.*)?$/.test(image)) problems.push(`mpijob: ${type} runs ${image}, not the ddprun-mpi image`);
  }
  const cpus = quantity(workers.template.spec.containers[0].resources.limits.cpu);
  if (job.spec.slotsPerWorker > cpus) problems.push(`mpijob: ${job.spec.slotsPerWorker} ranks on ${cpus} CPUs per worker`);
  return problems;
}

// The ElasticJob: its rendezvous endpoint is the etcd Service's name and port, etcd serves
// clients there, the controller's --nnodes range fits, and the pods run the Job's program with
// the Job's image and volumes; the etcd pod is one the NetworkPolicy admits the job's pods to.
function checkElasticJob(r) {
  const problems = [];
  const job = find(r.elasticjob, 'ElasticJob');
  const service = find(r.elasticjob, 'Service', 'etcd-service');
  const etcd = find(r.elasticjob, 'Deployment');
  const [host, port] = job.spec.rdzvEndpoint.split(':');
  if (host !== service.metadata.name) problems.push(`elasticjob: rdzvEndpoint ${job.spec.rdzvEndpoint} is not the Service ${service.metadata.name}`);
  const servicePort = service.spec.ports.find((p) => String(p.port) === port);
  if (!servicePort) problems.push(`elasticjob: the Service has no port ${port}`);
  const etcdContainer = etcd.spec.template.spec.containers[0];
  const named = (etcdContainer.ports || []).find((p) => p.name === (servicePort || {}).targetPort ||
    p.containerPort === (servicePort || {}).targetPort);
  const listen = (etcdContainer.args || []).find((a) => a.startsWith('--listen-client-urls='));
  if (!named || !listen || !listen.endsWith(`:${named.containerPort}`)) {
    problems.push(`elasticjob: etcd does not listen for clients on the Service's target port (${listen})`);
  }
  const selected = Object.entries(service.spec.selector || {}).every(([k, v]) => (etcd.spec.template.metadata.labels || {})[k] === v);
  if (!selected) problems.push('elasticjob: the Service does not select the etcd pod');
  const { minReplicas, maxReplicas } = job.spec;
  const workers = job.spec.replicaSpecs.Worker;
  if (!(minReplicas >= 1 && minReplicas <= workers.replicas && workers.replicas <= maxReplicas)) {
    problems.push(`elasticjob: not minReplicas ${minReplicas} <= replicas ${workers.replicas} <= maxReplicas ${maxReplicas}`);
  }
  const base = podSpecOf(find(r.base, 'Job', 'ddp-train')).containers[0];
  const c = workers.template.spec.containers[0];
  const program = (args) => args.slice(args.findIndex((a) => !a.startsWith('--')));
  if (JSON.stringify(program(c.args)) !== JSON.stringify(program(base.args))) {
    problems.push(`elasticjob: runs ${program(c.args).join(' ')}, not the Job's ${program(base.args).join(' ')}`);
  }
  // The controller adds the rendezvous flags; a second set in the args would contradict them.
  if (c.args.some((a) => /^--(rdzv|nnodes)/.test(a))) problems.push('elasticjob: the args set what the controller adds');
  if (c.image !== base.image) problems.push(`elasticjob: image ${c.image} != ${base.image}`);
  if (JSON.stringify(c.volumeMounts) !== JSON.stringify(base.volumeMounts)) problems.push('elasticjob: volume mounts differ from the Job\'s');
  return problems;
}

function runChecks(r, cluster, codes, dockerfile) {
  // [where, pod spec, the render it came from (for its ConfigMaps)]
  const jobPods = (name) => r[name].filter((o) => o.kind === 'Job')
    .map((j) => [`${name}/${j.metadata.name}`, podSpecOf(j), r[name]]);
  const pytorchPods = Object.entries(find(r.pytorchjob, 'PyTorchJob').spec.pytorchReplicaSpecs)
    .map(([type, s]) => [`pytorchjob/${type}`, s.template.spec, r.pytorchjob]);
  const elasticTemplate = find(r.elasticjob, 'ElasticJob').spec.replicaSpecs.Worker.template;
  const elasticPods = [['elasticjob/Worker', elasticTemplate.spec, r.elasticjob]];
  const checks = {
    'base: Indexed Job, headless Service, failure policy': () => checkIndexedJob(r.base, codes),
    'efa: Indexed Job, headless Service, failure policy': () => checkIndexedJob(r.efa, codes),
    'graviton: Indexed Job, headless Service, failure policy': () => checkIndexedJob(r.graviton, codes),
    'graviton-efa: Indexed Job, headless Service, failure policy': () => checkIndexedJob(r['graviton-efa'], codes),
    'e2e: Indexed Job, headless Service, failure policy': () => checkIndexedJob(r.e2e, codes),
    'e2e-2pods: Indexed Job, headless Service, failure policy': () => checkIndexedJob(r['e2e-2pods'], codes),
    'pods: requests = limits, non-root, threads <= CPUs, /dev/shm': () => checkPods([
      ...jobPods('base'), ...jobPods('efa'), ...jobPods('graviton'), ...jobPods('graviton-efa'),
      ...jobPods('doctor'), ...jobPods('monitoring'), ...jobPods('kueue'), ...jobPods('volcano'),
      ...jobPods('e2e'), ...jobPods('e2e-2pods'), ...jobPods('data-prep'),
      ...jobPods('eval'), ...jobPods('export'), ...jobPods('export-train'), ...pytorchPods, ...elasticPods]),
    'shared volume: data prep -> train -> eval paths, EFS claim': () => checkSharedVolume(r),
    'efa: fabric backend, EFA device, huge pages, eksctl node group': () => checkEfa(r, cluster),
    'eksctl: OIDC, EFS CSI, autoscaler tags, EFA groups, known instance types': () => checkCluster(cluster),
    'scheduling: kubernetes.io/arch of a node group, EFA only on efaEnabled groups, requests fit the node type': () =>
      checkScheduling([
        ...['base', 'efa', 'graviton', 'graviton-efa', 'monitoring', 'kueue', 'volcano', 'data-prep', 'eval',
          'export', 'export-train'].flatMap(jobPods),
        ...pytorchPods, ...elasticPods,
        ...Object.entries(find(r.mpijob, 'MPIJob').spec.mpiReplicaSpecs)
          .map(([type, s]) => [`mpijob/${type}`, s.template.spec, r.mpijob]),
        ...r.elasticjob.filter((o) => o.kind === 'Deployment')
          .map((d) => [`elasticjob/${d.metadata.name}`, d.spec.template.spec, r.elasticjob]),
      ], cluster),
    'pytorchjob: same program and flags, NODES pods': () => checkPyTorchJob(r),
    'image: USER matches runAsUser': () => checkImageUser(r, dockerfile),
    'export: IRSA ServiceAccount = the eksctl role, its policy covers DDP_EXPORT_S3_URI, training\'s checkpoints': () =>
      checkExport(r, cluster, codes),
    'gang: Volcano PodGroup = the pods, Kueue ClusterQueue holds the whole Job': () => checkGangScheduling(r),
    'mpijob: -np = workers x slots, the Job\'s program and flags': () => checkMpiJob(r),
    'elasticjob: rdzvEndpoint = the etcd Service, replicas in range, the Job\'s program': () => checkElasticJob(r),
    'metrics: one port in PET_METRICS_PORT, annotations, container, NetworkPolicy, PodMonitor': () =>
      checkMetrics([
        ...['base', 'efa', 'graviton', 'graviton-efa', 'monitoring'].map((n) => [n, find(r[n], 'Job', 'ddp-train').spec.template, r[n]]),
        ...Object.entries(find(r.pytorchjob, 'PyTorchJob').spec.pytorchReplicaSpecs)
          .map(([type, spec]) => [`pytorchjob/${type}`, spec.template, r.pytorchjob]),
      ]),
    'health: TORCHELASTIC_HEALTH_CHECK_PORT, container port, liveness probe': () =>
      checkHealth([
        ...['base', 'efa', 'graviton', 'graviton-efa', 'monitoring'].map((n) => [n, find(r[n], 'Job', 'ddp-train').spec.template, r[n]]),
        ...Object.entries(find(r.pytorchjob, 'PyTorchJob').spec.pytorchReplicaSpecs)
          .map(([type, spec]) => [`pytorchjob/${type}`, spec.template, r.pytorchjob]),
        ['elasticjob', elasticTemplate, r.elasticjob],
      ]),
    'join token: Secret mounted at DDPRUN_RDZV_TOKEN_FILE, NetworkPolicy admits the job': () =>
      checkJoinToken([...jobPods('base'), ...jobPods('efa'), ...jobPods('graviton'), ...jobPods('graviton-efa'),
        ...jobPods('e2e'), ...jobPods('e2e-2pods'),
        ...jobPods('export-train'), ...pytorchPods, ...elasticPods].map(([where, spec, objs]) => {
        if (spec === elasticTemplate.spec) return [where, spec, objs, elasticTemplate.metadata.labels || {}];
        const owner = objs.find((o) => (o.kind === 'Job' && podSpecOf(o) === spec) ||
          (o.kind === 'PyTorchJob' && Object.values(o.spec.pytorchReplicaSpecs).some((x) => x.template.spec === spec)));
        const template = owner.kind === 'Job' ? owner.spec.template
          : Object.values(owner.spec.pytorchReplicaSpecs).find((x) => x.template.spec === spec).template;
        return [where, spec, objs, template.metadata.labels || {}];
      })),
  };
  const results = {};
  for (const [name, check] of Object.entries(checks)) {
    try {
      results[name] = check();
    } catch (e) {
      results[name] = [`check crashed: ${e.message}`];
    }
  }
  return results;
}

// Each mutation breaks one property; the named check must report it.
const mutations = [
  ['base: Indexed Job, headless Service, failure policy', 'subdomain differs from the Service',
    (r) => { podSpecOf(find(r.base, 'Job')).subdomain = 'other'; }],
  ['base: Indexed Job, headless Service, failure policy', 'completions differ from NODES',
    (r) => { find(r.base, 'Job').spec.completions = 3; }],
  ['base: Indexed Job, headless Service, failure policy', 'FailJob on the rendezvous code',
    (r) => { find(r.base, 'Job').spec.podFailurePolicy.rules[0].onExitCodes.values.push(69); }],
  ['base: Indexed Job, headless Service, failure policy', 'an undefined $(VAR)',
    (r) => { podSpecOf(find(r.base, 'Job')).containers[0].args.push('--x=$(NOPE)'); }],
  ['efa: Indexed Job, headless Service, failure policy', 'no DisruptionTarget rule',
    (r) => { find(r.efa, 'Job').spec.podFailurePolicy.rules.pop(); }],
  ['pods: requests = limits, non-root, threads <= CPUs, /dev/shm', 'request below limit',
    (r) => { podSpecOf(find(r.eval, 'Job')).containers[0].resources.requests.cpu = '1'; }],
  ['pods: requests = limits, non-root, threads <= CPUs, /dev/shm', 'more ranks than CPUs',
    (r) => { find(r.base, 'ConfigMap').data.NPROC_PER_NODE = '64'; }],
  ['pods: requests = limits, non-root, threads <= CPUs, /dev/shm', 'OpenMP left to its default',
    (r) => { delete find(r.efa, 'ConfigMap').data.OMP_NUM_THREADS; }],
  ['pods: requests = limits, non-root, threads <= CPUs, /dev/shm', '60 ranks with a 1Gi /dev/shm',
    (r) => { podSpecOf(find(r.graviton, 'Job')).volumes.find((v) => v.name === 'dshm').emptyDir.sizeLimit = '1Gi'; }],
  ['pods: requests = limits, non-root, threads <= CPUs, /dev/shm', 'a /dev/shm larger than the memory limit it is charged to',
    (r) => { podSpecOf(find(r.base, 'Job')).volumes.find((v) => v.name === 'dshm').emptyDir.sizeLimit = '16Gi'; }],
  ['pods: requests = limits, non-root, threads <= CPUs, /dev/shm', 'DDP_DOCTOR_SHM_BYTES above the /dev/shm it checks',
    (r) => { find(r.base, 'ConfigMap').data.DDP_DOCTOR_SHM_BYTES = String(2 * 2 ** 30); }],
  ['shared volume: data prep -> train -> eval paths, EFS claim', 'eval reads another checkpoint directory',
    (r) => { podSpecOf(find(r.eval, 'Job')).containers[0].args[1] = '--checkpoint=/ckpt/other'; }],
  ['shared volume: data prep -> train -> eval paths, EFS claim', 'data prep stages elsewhere',
    (r) => { podSpecOf(find(r['data-prep'], 'Job')).containers[0].args[0] = '--dest=/shared/elsewhere'; }],
  ['efa: fabric backend, EFA device, huge pages, eksctl node group', 'TCP backend on EFA',
    (r) => { find(r.efa, 'ConfigMap').data.DDP_BACKEND = 'gloo'; }],
  ['efa: fabric backend, EFA device, huge pages, eksctl node group', 'TCP backend on Graviton EFA',
    (r) => { find(r['graviton-efa'], 'ConfigMap').data.DDP_BACKEND = 'gloo'; }],
  ['efa: fabric backend, EFA device, huge pages, eksctl node group', 'Graviton EFA nodes preallocating fewer huge pages than requested',
    (r, cluster) => {
      const g = cluster.managedNodeGroups.find((x) => x.efaEnabled && archOf(x.instanceType) === 'arm64');
      g.preBootstrapCommands = g.preBootstrapCommands.map((cmd) => cmd.replace(/nr_hugepages=\d+/, 'nr_hugepages=1024'));
    }],
  ['eksctl: OIDC, EFA group', 'EFA group in two AZs',
    (r, cluster) => { cluster.managedNodeGroups.find((g) => g.efaEnabled).availabilityZones.push('us-west-2b'); }],
  ['eksctl: OIDC, EFA group', 'a node group of an instance type without allocatable figures',
    (r, cluster) => { cluster.managedNodeGroups.find((g) => archOf(g.instanceType) === 'arm64').instanceType = 'c7g.12xlarge'; }],
  ['eksctl: OIDC, EFA group', 'efaEnabled on an instance type without EFA',
    (r, cluster) => {
      const g = cluster.managedNodeGroups.find((x) => x.instanceType === 'c6i.2xlarge');
      Object.assign(g, { efaEnabled: true, availabilityZones: ['us-west-2a'], placement: { groupName: 'x' } });
      g.tags['k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa'] = '1';
    }],
  ['scheduling:', 'an arm64 selector and no arm64 node group',
    (r, cluster) => { cluster.managedNodeGroups = cluster.managedNodeGroups.filter((g) => archOf(g.instanceType) !== 'arm64'); }],
  ['scheduling:', 'a Graviton pod larger than a c7g.16xlarge offers',
    (r) => {
      const { requests, limits } = podSpecOf(find(r.graviton, 'Job')).containers[0].resources;
      requests.cpu = limits.cpu = '64';
    }],
  ['scheduling:', 'memory that fits a c7g.16xlarge but not a c7gn.16xlarge less its huge pages',
    (r) => {
      const { requests, limits } = podSpecOf(find(r['graviton-efa'], 'Job')).containers[0].resources;
      requests.memory = limits.memory = '104Gi';
    }],
  ['scheduling:', 'EFA devices requested on the Graviton CPU nodes, which are not efaEnabled',
    (r) => {
      const { requests, limits } = podSpecOf(find(r.graviton, 'Job')).containers[0].resources;
      requests['vpc.amazonaws.com/efa'] = limits['vpc.amazonaws.com/efa'] = '1';
    }],
  ['scheduling:', 'nodes chosen by instance name',
    (r) => { podSpecOf(find(r.graviton, 'Job')).nodeSelector['node.kubernetes.io/instance-type'] = 'c7g.16xlarge'; }],
  ['scheduling:', 'a pod that names no architecture on a cluster of both',
    (r) => { delete podSpecOf(find(r.base, 'Job')).nodeSelector['kubernetes.io/arch']; }],
  ['scheduling:', 'an architecture the kubelet does not write',
    (r) => { podSpecOf(find(r.graviton, 'Job')).nodeSelector['kubernetes.io/arch'] = 'aarch64'; }],
  ['scheduling:', 'a Graviton group scaling from zero whose node template lacks kubernetes.io/arch',
    (r, cluster) => {
      const g = cluster.managedNodeGroups.find((x) => archOf(x.instanceType) === 'arm64' && !x.efaEnabled);
      delete g.tags['k8s.io/cluster-autoscaler/node-template/label/kubernetes.io/arch'];
    }],
  ['join token: Secret mounted at DDPRUN_RDZV_TOKEN_FILE, NetworkPolicy admits the job', 'token file outside the Secret',
    (r) => { find(r.base, 'ConfigMap').data.DDPRUN_RDZV_TOKEN_FILE = '/tmp/token'; }],
  ['join token: Secret mounted at DDPRUN_RDZV_TOKEN_FILE, NetworkPolicy admits the job', 'policy selects other pods',
    (r) => { find(r.efa, 'NetworkPolicy').spec.podSelector.matchLabels['app.kubernetes.io/instance'] = 'other'; }],
  ['join token: Secret mounted at DDPRUN_RDZV_TOKEN_FILE, NetworkPolicy admits the job', 'policy admits nobody',
    (r) => { find(r.base, 'NetworkPolicy').spec.ingress = []; }],
  ['pytorchjob: same program and flags, NODES pods', 'a flag only in the PyTorchJob',
    (r) => { find(r.pytorchjob, 'PyTorchJob').spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].args.push('--epochs=1'); }],
  ['gang: Volcano', 'minMember below the pods',
    (r) => { find(r.volcano, 'PodGroup').spec.minMember = 1; }],
  ['gang: Volcano', 'a ClusterQueue too small for the whole Job',
    (r) => { find(r.kueue, 'ClusterQueue').spec.resourceGroups[0].flavors[0].resources[0].nominalQuota = 4; }],
  ['gang: Volcano', 'a Job that Kueue would not hold',
    (r) => { delete find(r.kueue, 'Job').spec.suspend; }],
  ['elasticjob:', 'an rdzvEndpoint that is not the etcd Service',
    (r) => { find(r.elasticjob, 'ElasticJob').spec.rdzvEndpoint = 'etcd:2379'; }],
  ['elasticjob:', 'etcd listening on another port than the Service\'s',
    (r) => { find(r.elasticjob, 'Deployment').spec.template.spec.containers[0].args[2] = '--listen-client-urls=http://0.0.0.0:4001'; }],
  ['elasticjob:', 'more replicas than maxReplicas',
    (r) => { find(r.elasticjob, 'ElasticJob').spec.replicaSpecs.Worker.replicas = 9; }],
  ['elasticjob:', 'a rendezvous flag that the controller also adds',
    (r) => { find(r.elasticjob, 'ElasticJob').spec.replicaSpecs.Worker.template.spec.containers[0].args.unshift('--rdzv-backend=c10d'); }],
  ['mpijob: -np', 'mpirun -np not workers x slots',
    (r) => { find(r.mpijob, 'MPIJob').spec.mpiReplicaSpecs.Worker.replicas = 3; }],
  ['mpijob: -np', 'no MASTER_ADDR for the ranks on the workers',
    (r) => { find(r.mpijob, 'MPIJob').spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].command = ['mpirun']; }],
  ['mpijob: -np', 'the workers on the plain image, without sshd',
    (r) => { find(r.mpijob, 'MPIJob').spec.mpiReplicaSpecs.Worker.template.spec.containers[0].image = 'ddprun'; }],
  ['mpijob: -np', 'a flag only in the MPIJob',
    (r) => { find(r.mpijob, 'MPIJob').spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].args.push('--epochs=1'); }],
  ['health: TORCHELASTIC_HEALTH_CHECK_PORT', 'the liveness probe asks the metrics port',
    (r) => { find(r.base, 'Job').spec.template.spec.containers[0].livenessProbe.httpGet.port = 9400; }],
  ['health: TORCHELASTIC_HEALTH_CHECK_PORT', 'the probe asks a path ddprun does not answer',
    (r) => { find(r.efa, 'Job').spec.template.spec.containers[0].livenessProbe.httpGet.path = '/ready'; }],
  ['metrics: one port', 'annotations announce another port',
    (r) => { find(r.base, 'Job').spec.template.metadata.annotations['prometheus.io/port'] = '9500'; }],
  ['metrics: one port', 'the PodMonitor scrapes a port the pods do not name',
    (r) => { find(r.monitoring, 'PodMonitor').spec.podMetricsEndpoints[0].port = 'metric'; }],
  ['metrics: one port', 'the NetworkPolicy drops Prometheus',
    (r) => { find(r.efa, 'NetworkPolicy').spec.ingress.pop(); }],
  ['export: IRSA', 'the IRSA entry in another namespace than the ServiceAccount',
    (r, cluster) => { cluster.iam.serviceAccounts.find((s) => s.metadata.name === 'ddp-export').metadata.namespace = 'ml'; }],
  ['export: IRSA', 'the annotation names another role',
    (r) => { find(r['export-train'], 'ServiceAccount').metadata.annotations['eks.amazonaws.com/role-arn'] = 'arn:aws:iam::111122223333:role/other'; }],
  ['export: IRSA', 'an S3 prefix outside the policy',
    (r) => { find(r.export, 'ConfigMap').data.DDP_EXPORT_S3_URI = 's3://ddprun-models/elsewhere'; }],
  ['export: IRSA', 'the export reads another checkpoint directory',
    (r) => { podSpecOf(find(r.export, 'Job')).containers[0].args[0] = '--checkpoint-dir=/ckpt/other'; }],
  ['export: IRSA', 'the training in the export overlay differs from the Job\'s',
    (r) => { podSpecOf(find(r['export-train'], 'Job')).containers[0].args.push('--epochs=1'); }],
];

function main() {
  const args = parseArgs(process.argv.slice(2));
  const codes = readExitCodes(args['exit-codes']);
  const load = () => {
    const r = {};
    for (const name of ['base', 'efa', 'graviton', 'graviton-efa', 'doctor', 'pytorchjob', 'monitoring', 'kueue', 'volcano', 'mpijob', 'elasticjob',
      'data-prep', 'eval', 'efs', 'e2e', 'e2e-2pods', 'export', 'export-train']) {
      r[name] = loadAll(path.join(args.rendered, `${name}.yaml`));
    }
    return [r, YAML.parse(fs.readFileSync(args.eksctl, 'utf8'))];
  };
  let passed = 0;
  let failed = 0;
  if (!args.selfTest) {
    const [r, cluster] = load();
    for (const [name, problems] of Object.entries(runChecks(r, cluster, codes, args.dockerfile))) {
      if (problems.length) failed++;
      else passed++;
      console.log(`${problems.length ? 'FAIL' : 'ok  '} ${name}`);
      for (const p of problems) console.log(`       ${p}`);
    }
  } else {
    for (const [checkPrefix, what, mutate] of mutations) {
      const [r, cluster] = load();
      mutate(r, cluster);
      const results = runChecks(r, cluster, codes, args.dockerfile);
      const name = Object.keys(results).find((n) => n.startsWith(checkPrefix.split(',')[0]));
      const caught = name && results[name].length > 0 && !results[name].some((p) => p.startsWith('check crashed'));
      if (caught) passed++;
      else failed++;
      console.log(`${caught ? 'caught' : 'MISSED'} ${what}${caught ? `: ${results[name][0]}` : ''}`);
    }
  }
  console.log(`${passed} passed, ${failed} failed`);
  process.exitCode = failed ? 1 : 0;
}

main();
