#!/usr/bin/env node
// Validates rendered Kubernetes manifests against the Kubernetes API schema (kubernetes-models),
// strictly: a field the schema does not know (a typo such as `resorces`) is an error too, as it
// is for `kubectl apply --validate=strict`. Kubeflow's PyTorchJob has no published schema here:
// its own fields are checked against the v1 API's field list and each pod template against the
// core PodTemplateSpec schema. The Prometheus Operator's kinds (PodMonitor) are checked against
// the schemas its npm package generates from the operator's CRDs.
//
//   node validate.js FILE...                   every object valid -> exit 0, else list errors, exit 1
//   node validate.js --expect-invalid FILE...  every file must be rejected with the message its
//                                              `# expect: TEXT` comment names (the checker's own test)
'use strict';
const fs = require('fs');
const path = require('path');
const YAML = require('yaml');

// The schema validators read every property they know and enumerate the keys of map-typed
// objects (labels, resources.limits). Watching those reads through a Proxy tells which keys of
// a non-map object the schema never looked at: those are the unknown fields.
function watchReads(value, at, records) {
  if (value === null || typeof value !== 'object') return value;
  const record = { value, at, read: new Set(), enumerated: false };
  records.push(record);
  const children = new Map();
  return new Proxy(value, {
    get(target, key, receiver) {
      if (typeof key === 'string') record.read.add(key);
      const child = Reflect.get(target, key, receiver);
      if (typeof key !== 'string' || child === null || typeof child !== 'object') return child;
      if (!children.has(key)) {
        const childAt = Array.isArray(target) ? `${at}[${key}]` : `${at}.${key}`;
        children.set(key, watchReads(child, childAt, records));
      }
      return children.get(key);
    },
    has(target, key) {
      if (typeof key === 'string') record.read.add(key);
      return Reflect.has(target, key);
    },
    ownKeys(target) {
      record.enumerated = true;
      return Reflect.ownKeys(target);
    },
  });
}

function unknownFields(records) {
  const found = [];
  for (const r of records) {
    if (r.enumerated || Array.isArray(r.value)) continue;
    for (const key of Object.keys(r.value)) {
      if (!r.read.has(key)) found.push(`${r.at}.${key}`.replace(/^\./, ''));
    }
  }
  return found;
}

// Runs a kubernetes-models validator on `value` (rooted at `at`); returns error strings.
function validateWith(Model, value, at) {
  const records = [];
  const errors = [];
  try {
    Model.prototype.validate.call(watchReads(value, at, records));
  } catch (e) {
    if (!e.errors) throw e;
    for (const err of e.errors) {
      const field = `${at}${err.instancePath}`.replace(/\/(\d+)/g, '[$1]').replace(/\//g, '.');
      errors.push(`${field.replace(/^\./, '') || '(object)'}: ${err.message}`);
    }
  }
  for (const field of unknownFields(records)) errors.push(`${field}: unknown field`);
  return errors;
}

function coreModel(apiVersion, kind) {
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : [null, apiVersion];
  const modulePath = group ? `kubernetes-models/${group}/${version}/${kind}` : `kubernetes-models/${version}/${kind}`;
  try {
    return require(modulePath)[kind];
  } catch (e) {
    if (e.code === 'MODULE_NOT_FOUND' || e.code === 'ERR_PACKAGE_PATH_NOT_EXPORTED') return null;
    throw e;
  }
}

// Kubeflow training-operator v1 (kubeflow.org/v1 PyTorchJob): the fields its API defines.
const pytorchJobFields = {
  top: ['apiVersion', 'kind', 'metadata', 'spec', 'status'],
  spec: ['runPolicy', 'elasticPolicy', 'nprocPerNode', 'pytorchReplicaSpecs'],
  runPolicy: ['cleanPodPolicy', 'ttlSecondsAfterFinished', 'activeDeadlineSeconds', 'backoffLimit',
    'schedulingPolicy', 'suspend', 'managedBy'],
  replica: ['replicas', 'restartPolicy', 'template'],
  replicaTypes: ['Master', 'Worker'],
  restartPolicies: ['Always', 'OnFailure', 'Never', 'ExitCode'],
  cleanPodPolicies: ['All', 'Running', 'None'],
};

function validatePyTorchJob(obj) {
  const errors = [];
  const allowOnly = (value, allowed, at) => {
    for (const key of Object.keys(value || {})) {
      if (!allowed.includes(key)) errors.push(`${at}.${key}: unknown field`.replace(/^\./, ''));
    }
  };
  allowOnly(obj, pytorchJobFields.top, '');
  const { ObjectMeta } = require('@kubernetes-models/apimachinery/apis/meta/v1/ObjectMeta');
  errors.push(...validateWith(ObjectMeta, obj.metadata || {}, 'metadata'));
  const spec = obj.spec || {};
  allowOnly(spec, pytorchJobFields.spec, 'spec');
  allowOnly(spec.runPolicy, pytorchJobFields.runPolicy, 'spec.runPolicy');
  const cleanPodPolicy = spec.runPolicy && spec.runPolicy.cleanPodPolicy;
  if (cleanPodPolicy !== undefined && !pytorchJobFields.cleanPodPolicies.includes(cleanPodPolicy)) {
    errors.push(`spec.runPolicy.cleanPodPolicy: must be one of ${pytorchJobFields.cleanPodPolicies}`);
  }
  const replicas = spec.pytorchReplicaSpecs || {};
  if (!replicas.Master) errors.push('spec.pytorchReplicaSpecs.Master: required');
  allowOnly(replicas, pytorchJobFields.replicaTypes, 'spec.pytorchReplicaSpecs');
  const PodTemplateSpec = coreModel('v1', 'PodTemplateSpec');
  for (const [type, replica] of Object.entries(replicas)) {
    const at = `spec.pytorchReplicaSpecs.${type}`;
    allowOnly(replica, pytorchJobFields.replica, at);
    if (!Number.isInteger(replica.replicas) || replica.replicas < 1) {
      errors.push(`${at}.replicas: must be a positive integer`);
    }
    if (!pytorchJobFields.restartPolicies.includes(replica.restartPolicy)) {
      errors.push(`${at}.restartPolicy: must be one of ${pytorchJobFields.restartPolicies}`);
    }
    if (!replica.template) {
      errors.push(`${at}.template: required`);
      continue;
    }
    errors.push(...validateWith(PodTemplateSpec, replica.template, `${at}.template`));
    const containers = (replica.template.spec && replica.template.spec.containers) || [];
    if (!containers.some((c) => c.name === 'pytorch')) {
      errors.push(`${at}.template.spec.containers: the operator needs a container named "pytorch"`);
    }
  }
  return errors;
}

// Custom resources with a published schema on npm: the Prometheus Operator's CRDs
// (@kubernetes-models/prometheus-operator, generated from the operator's own CRD manifests).
const crdModules = {
  'monitoring.coreos.com/v1': '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1',
};

function crdModel(apiVersion, kind) {
  const base = crdModules[apiVersion];
  if (!base) return null;
  try {
    return require(`${base}/${kind}`)[kind];
  } catch (e) {
    if (e.code === 'MODULE_NOT_FOUND' || e.code === 'ERR_PACKAGE_PATH_NOT_EXPORTED') return null;
    throw e;
  }
}

// Custom resources whose CRDs no registry reachable here publishes as a schema package: their
// fields as the projects' published API types define them (the versions named), checked strictly
// (an unknown field is an error), with embedded core types checked by the core schemas.
//   shapes: 'string', 'name' (a DNS-1123 subdomain), 'integer', 'boolean', 'quantity' (string or number), ['enum', ...values],
//   { fields: {...}, required: [...] }, { array: shape }, { map: shape }, or a core model
//   ('core:v1/PodTemplateSpec', 'meta:LabelSelector').
const kueueFlavorQuotas = {
  fields: {
    name: 'name',
    resources: { array: { fields: { name: 'string', nominalQuota: 'quantity', borrowingLimit: 'quantity',
      lendingLimit: 'quantity' }, required: ['name', 'nominalQuota'] } },
  },
  required: ['name', 'resources'],
};
const runPolicy = {  // kubeflow.org common RunPolicy (training-operator / mpi-operator v2beta1)
  fields: { cleanPodPolicy: ['enum', 'None', 'Running', 'All'], ttlSecondsAfterFinished: 'integer',
    activeDeadlineSeconds: 'integer', backoffLimit: 'integer', suspend: 'boolean', managedBy: 'string',
    schedulingPolicy: { fields: { minAvailable: 'integer', queue: 'string', minResources: { map: 'quantity' },
      priorityClass: 'string', scheduleTimeoutSeconds: 'integer' } } },
};
const crdShapes = {
  // Kueue v1beta1 (kueue.x-k8s.io): apis/kueue/v1beta1/{localqueue,clusterqueue,resourceflavor}_types.go
  'kueue.x-k8s.io/v1beta1': {
    LocalQueue: { fields: { clusterQueue: 'name', stopPolicy: ['enum', 'None', 'Hold', 'HoldAndDrain'],
      fairSharing: { fields: { weight: 'quantity' } } } },
    ClusterQueue: {
      fields: {
        resourceGroups: { array: { fields: { coveredResources: { array: 'string' },
          flavors: { array: kueueFlavorQuotas } }, required: ['coveredResources', 'flavors'] } },
        cohort: 'name', namespaceSelector: 'meta:LabelSelector',
        queueingStrategy: ['enum', 'StrictFIFO', 'BestEffortFIFO'],
        flavorFungibility: { fields: { whenCanBorrow: ['enum', 'Borrow', 'TryNextFlavor'],
          whenCanPreempt: ['enum', 'Preempt', 'TryNextFlavor'] } },
        preemption: { fields: { reclaimWithinCohort: ['enum', 'Never', 'LowerPriority', 'Any'],
          withinClusterQueue: ['enum', 'Never', 'LowerPriority', 'LowerOrNewerEqualPriority'],
          borrowWithinCohort: { fields: { policy: ['enum', 'Never', 'LowerPriority'], maxPriorityThreshold: 'integer' } } } },
        admissionChecks: { array: 'string' },
        stopPolicy: ['enum', 'None', 'Hold', 'HoldAndDrain'],
        fairSharing: { fields: { weight: 'quantity' } },
      },
    },
    ResourceFlavor: { fields: { nodeLabels: { map: 'string' }, nodeTaints: { array: 'core:v1/Taint' },
      tolerations: { array: 'core:v1/Toleration' }, topologyName: 'string' } },
  },
  // Volcano v1beta1 (scheduling.volcano.sh): pkg/apis/scheduling/v1beta1/types.go PodGroupSpec
  'scheduling.volcano.sh/v1beta1': {
    PodGroup: { fields: { minMember: 'integer', minTaskMember: { map: 'integer' }, queue: 'string',
      priorityClassName: 'string', minResources: { map: 'quantity' } } },
  },
  // TorchElastic's controller (elastic.pytorch.org/v1alpha1, pytorch/elastic): kubernetes/api/
  // v1alpha1/elasticjob_types.go ElasticJobSpec, whose RunPolicy is inline.
  'elastic.pytorch.org/v1alpha1': {
    ElasticJob: {
      fields: {
        ...runPolicy.fields, rdzvEndpoint: 'string', minReplicas: 'integer', maxReplicas: 'integer',
        replicaSpecs: { fields: {
          Worker: { fields: { replicas: 'integer', restartPolicy: ['enum', 'Always', 'OnFailure', 'Never', 'ExitCode'],
            template: 'core:v1/PodTemplateSpec' }, required: ['template'] },
        }, required: ['Worker'] },
      },
      required: ['replicaSpecs', 'rdzvEndpoint'],
    },
  },
  // Kubeflow MPI operator v2beta1 (kubeflow.org): pkg/apis/kubeflow/v2beta1/types.go MPIJobSpec
  'kubeflow.org/v2beta1': {
    MPIJob: {
      fields: {
        slotsPerWorker: 'integer', runLauncherAsWorker: 'boolean', runPolicy, sshAuthMountPath: 'string',
        launcherCreationPolicy: ['enum', 'AtStartup', 'WaitForWorkersReady'],
        mpiImplementation: ['enum', 'OpenMPI', 'Intel', 'MPICH'],
        mpiReplicaSpecs: { fields: {
          Launcher: { fields: { replicas: 'integer', restartPolicy: ['enum', 'Always', 'OnFailure', 'Never', 'ExitCode'],
            template: 'core:v1/PodTemplateSpec' }, required: ['template'] },
          Worker: { fields: { replicas: 'integer', restartPolicy: ['enum', 'Always', 'OnFailure', 'Never', 'ExitCode'],
            template: 'core:v1/PodTemplateSpec' }, required: ['template'] },
        }, required: ['Launcher'] },
      },
      required: ['mpiReplicaSpecs'],
    },
  },
};

function checkShape(value, shape, at, errors) {
  const where = at || '(object)';
  if (typeof shape === 'string' && shape.includes(':')) {
    const [ns, name] = shape.split(':');
    const Model = ns === 'meta'
      ? require(`@kubernetes-models/apimachinery/apis/meta/v1/${name}`)[name]
      : coreModel(name.split('/')[0], name.split('/')[1]);
    errors.push(...validateWith(Model, value, at));
    return;
  }
  if (Array.isArray(shape)) {
    if (!shape.slice(1).includes(value)) errors.push(`${where}: must be one of ${shape.slice(1).join(', ')}`);
    return;
  }
  const type = (ok, what) => { if (!ok) errors.push(`${where}: must be ${what}`); };
  if (shape === 'string') return type(typeof value === 'string', 'string');
  if (shape === 'name') {  // an object's name: a DNS-1123 subdomain
    return type(typeof value === 'string' && value.length <= 253 &&
      /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/.test(value), 'a DNS-1123 name');
  }
  if (shape === 'integer') return type(Number.isInteger(value), 'integer');
  if (shape === 'boolean') return type(typeof value === 'boolean', 'boolean');
  if (shape === 'quantity') return type(typeof value === 'number' || /^[+-]?\d+(\.\d+)?([eE][+-]?\d+|[mkMGTPE]|[KMGTPE]i)?$/.test(String(value)) && typeof value !== 'boolean', 'a quantity');
  if (value === null || typeof value !== 'object' || Array.isArray(value) !== Boolean(shape.array)) {
    return type(false, shape.array ? 'array' : 'object');
  }
  if (shape.array) return value.forEach((v, i) => checkShape(v, shape.array, `${at}[${i}]`, errors));
  if (shape.map) return Object.entries(value).forEach(([k, v]) => checkShape(v, shape.map, `${at}.${k}`, errors));
  for (const key of shape.required || []) {
    if (!(key in value)) errors.push(`${where}: must have required property ${key}`);
  }
  for (const [key, v] of Object.entries(value)) {
    if (!(key in shape.fields)) errors.push(`${at ? `${at}.` : ''}${key}: unknown field`);
    else checkShape(v, shape.fields[key], at ? `${at}.${key}` : key, errors);
  }
}

function validateCustomResource(obj, shape) {
  const errors = [];
  const { ObjectMeta } = require('@kubernetes-models/apimachinery/apis/meta/v1/ObjectMeta');
  errors.push(...validateWith(ObjectMeta, obj.metadata || {}, 'metadata'));
  for (const key of Object.keys(obj)) {
    if (!['apiVersion', 'kind', 'metadata', 'spec', 'status'].includes(key)) errors.push(`${key}: unknown field`);
  }
  checkShape(obj.spec || {}, shape, 'spec', errors);
  return errors;
}

function validateObject(obj) {
  if (!obj || typeof obj !== 'object') return ['not a Kubernetes object'];
  if (!obj.apiVersion || !obj.kind) return ['apiVersion and kind are required'];
  if (obj.apiVersion === 'kubeflow.org/v1' && obj.kind === 'PyTorchJob') return validatePyTorchJob(obj);
  const shape = (crdShapes[obj.apiVersion] || {})[obj.kind];
  if (shape) return validateCustomResource(obj, shape);
  const Model = coreModel(obj.apiVersion, obj.kind) || crdModel(obj.apiVersion, obj.kind);
  if (!Model) return [`no schema for ${obj.apiVersion} ${obj.kind}`];
  return validateWith(Model, obj, '');
}

function validateFile(file) {
  const errors = [];
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, 'utf8'));
  let count = 0;
  for (const doc of docs) {
    if (doc.errors.length) {
      errors.push(`${file}: YAML: ${doc.errors[0].message}`);
      continue;
    }
    const obj = doc.toJS();
    if (obj === null) continue;
    count++;
    const name = `${obj.kind || '?'}/${(obj.metadata && obj.metadata.name) || '?'}`;
    for (const e of validateObject(obj)) errors.push(`${path.basename(file)}: ${name}: ${e}`);
  }
  if (count === 0) errors.push(`${file}: no objects`);
  return { count, errors };
}

function main(argv) {
  const expectInvalid = argv[0] === '--expect-invalid';
  const files = expectInvalid ? argv.slice(1) : argv;
  if (files.length === 0) {
    console.error('usage: validate.js [--expect-invalid] FILE...');
    return 64;
  }
  let failed = 0;
  for (const file of files) {
    const { count, errors } = validateFile(file);
    if (!expectInvalid) {
      if (errors.length) {
        failed++;
        for (const e of errors) console.log(`INVALID ${e}`);
      } else {
        console.log(`valid   ${path.basename(file)}: ${count} objects`);
      }
      continue;
    }
    const expected = (fs.readFileSync(file, 'utf8').match(/^# expect: (.+)$/m) || [])[1];
    if (!expected) {
      failed++;
      console.log(`BROKEN  ${file}: has no '# expect: TEXT' line`);
    } else if (errors.some((e) => e.includes(expected))) {
      console.log(`rejected ${path.basename(file)}: ${errors.find((e) => e.includes(expected))}`);
    } else {
      failed++;
      console.log(`MISSED  ${path.basename(file)}: expected an error containing '${expected}', got: ` +
        (errors.length ? errors.join('; ') : 'no error'));
    }
  }
  console.log(`${files.length - failed} passed, ${failed} failed`);
  return failed ? 1 : 0;
}

process.exitCode = main(process.argv.slice(2));
