package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/airlock-dev/airlock/kube/agenttls"
	"github.com/airlock-dev/airlock/kube/egressproxy"
	"github.com/airlock-dev/airlock/policy"
)

// The pod contract (docs/kubernetes.md): names, paths and ports shared
// with the agent's listen mode and the install-agent init container.
const (
	// AgentPort is where the agent listens in the pod (TLS + token).
	AgentPort = 7070
	// BinVolume is the emptyDir the init container copies airlock into.
	BinVolume = "airlock-bin"
	// BinDir is where BinVolume is mounted in both containers.
	BinDir = "/airlock-bin"
	// TLSVolume is the per-sandbox Secret's volume.
	TLSVolume = "airlock-tls"
	// TLSDir is where TLSVolume is mounted, read-only, in the sandbox.
	TLSDir = "/airlock-tls"
	// InitContainer installs the agent binary.
	InitContainer = "airlock-install"
	// SandboxContainer runs the agent and everything the sandbox runs.
	SandboxContainer = "sandbox"
	// AgentImageBinary is where the agent image holds the static airlock.
	AgentImageBinary = "/airlock"
)

// Labels and annotations airlock puts on its objects.
const (
	// LabelSandbox holds the sandbox id (on the Sandbox, its pod and Secret).
	LabelSandbox = "airlock.dev/sandbox"
	// LabelOwner holds OwnerLabel of the API key owning the sandbox.
	LabelOwner = "airlock.dev/owner"
	// LabelManagedBy is app.kubernetes.io/managed-by.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedBy is LabelManagedBy's value.
	ManagedBy = "airlock"
	// AnnotationNetwork is the JSON of the sandbox's policy.Network (the
	// cluster egress proxy reads it).
	AnnotationNetwork = "airlock.dev/network"
	// AnnotationOwner is the owner's API key id, exactly.
	AnnotationOwner = "airlock.dev/owner"
	// AnnotationPolicy is the JSON of the sandbox's policy.Policy.
	AnnotationPolicy = "airlock.dev/policy"
	// AnnotationMetadata is the JSON of the sandbox's metadata labels.
	AnnotationMetadata = "airlock.dev/metadata"
	// AnnotationRuntime is the sandbox's isolation tier.
	AnnotationRuntime = "airlock.dev/runtime"
)

// OwnerLabel is the value of LabelOwner for an API key id: a hash, since
// key ids need not be valid label values (the exact id is in
// AnnotationOwner).
func OwnerLabel(owner string) string {
	h := sha256.Sum256([]byte("airlock-owner\x00" + owner))
	return hex.EncodeToString(h[:16])
}

// podParams is what a sandbox's pod is made from.
type podParams struct {
	id           string
	policy       policy.Policy
	image        string
	agentImage   string
	runtimeClass string // "" for the cluster's default
	env          []string
	egressCA     bool // mount the egress Secret's CA and bundle at EgressCADir
	// pooled makes the pod of a warm pool (pool.go): the Secret PoolCASecret
	// (the CA certificate alone) instead of the sandbox's own, and the
	// agent started with --pool-ca, to be enrolled after the claim.
	pooled bool
}

// The egress Secret's files in the pod (only these keys: never ca.key).
const (
	// EgressCAVolume is the volume of the sandbox's egress Secret.
	EgressCAVolume = "airlock-egress-ca"
	// EgressCADir is where its CA files are mounted, read-only.
	EgressCADir = "/etc/airlock"
	// EgressBundleKey holds the server's CA bundle plus the sandbox's
	// interception CA, in the egress Secret.
	EgressBundleKey = "ca-bundle.crt"
)

// sandboxUID runs the sandbox's processes: not root, as in native
// sandboxes (policy.User's uid is 1000 in every preset).
const sandboxUID = 1000

// podSpec maps a policy to the pod of a sandbox (see the package doc).
func podSpec(pp podParams) (corev1.PodSpec, error) {
	lim := pp.policy.Limits
	if lim.MemoryBytes <= 0 || lim.CPUs <= 0 {
		return corev1.PodSpec{}, fmt.Errorf("kube: the policy has no memory or cpu limit")
	}
	uid := int64(pp.policy.User.UID)
	gid := int64(pp.policy.User.GID)
	if uid <= 0 {
		uid, gid = sandboxUID, sandboxUID
	}
	sc := &corev1.SecurityContext{
		RunAsNonRoot:             ptr.To(true),
		RunAsUser:                ptr.To(uid),
		RunAsGroup:               ptr.To(gid),
		AllowPrivilegeEscalation: ptr.To(false),
		Privileged:               ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	mem := resource.NewQuantity(lim.MemoryBytes, resource.BinarySI)
	cpu := resource.NewMilliQuantity(int64(lim.CPUs*1000+0.5), resource.DecimalSI)
	res := corev1.ResourceList{corev1.ResourceMemory: *mem, corev1.ResourceCPU: *cpu}
	if lim.DiskBytes > 0 {
		// /workspace and /tmp, each of DiskBytes, are emptyDirs: the
		// pod's ephemeral storage.
		res[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(2*lim.DiskBytes, resource.BinarySI)
	}
	var env []corev1.EnvVar
	for _, kv := range pp.env {
		k, v, _ := strings.Cut(kv, "=")
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	emptyDir := func(name string, size int64) corev1.Volume {
		ed := &corev1.EmptyDirVolumeSource{}
		if size > 0 {
			ed.SizeLimit = resource.NewQuantity(size, resource.BinarySI)
		}
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: ed}}
	}
	tlsVolume := corev1.Volume{Name: TLSVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: agenttls.SecretName(pp.id), DefaultMode: ptr.To(int32(0o440))}}}
	agentCmd := []string{BinDir + "/airlock", "agent", "--listen", fmt.Sprintf(":%d", AgentPort), "--tls-dir", TLSDir}
	if pp.pooled {
		tlsVolume.Secret = &corev1.SecretVolumeSource{SecretName: PoolCASecret, DefaultMode: ptr.To(int32(0o444)),
			Items: []corev1.KeyToPath{{Key: agenttls.CACertKey, Path: agenttls.CACertKey}}}
		agentCmd = []string{BinDir + "/airlock", "agent", "--listen", fmt.Sprintf(":%d", AgentPort), "--pool-ca", TLSDir}
	}
	spec := corev1.PodSpec{
		// The agent is PID 1 and, as on a single node, ignores SIGTERM:
		// a deleted pod would only wait out the grace period.
		TerminationGracePeriodSeconds: ptr.To(int64(2)),
		AutomountServiceAccountToken:  ptr.To(false),
		EnableServiceLinks:            ptr.To(false),
		HostNetwork:                   false,
		HostPID:                       false,
		HostIPC:                       false,
		Hostname:                      pp.policy.User.Hostname,
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot:   ptr.To(true),
			RunAsUser:      ptr.To(uid),
			RunAsGroup:     ptr.To(gid),
			FSGroup:        ptr.To(gid),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Volumes: []corev1.Volume{
			emptyDir(BinVolume, 256<<20),
			tlsVolume,
			emptyDir("workspace", lim.DiskBytes),
			emptyDir("tmp", lim.DiskBytes),
		},
		InitContainers: []corev1.Container{{
			Name:            InitContainer,
			Image:           pp.agentImage,
			Command:         []string{AgentImageBinary, "install-agent", BinDir + "/airlock"},
			SecurityContext: sc,
			Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi"), corev1.ResourceCPU: resource.MustParse("250m")},
			},
			VolumeMounts: []corev1.VolumeMount{{Name: BinVolume, MountPath: BinDir}},
		}},
		Containers: []corev1.Container{{
			Name:            SandboxContainer,
			Image:           pp.image,
			Command:         agentCmd,
			WorkingDir:      "/workspace",
			Env:             env,
			Ports:           []corev1.ContainerPort{{Name: "agent", ContainerPort: AgentPort, Protocol: corev1.ProtocolTCP}},
			SecurityContext: sc,
			// Requests equal limits: the scheduler reserves what the
			// policy grants (Guaranteed QoS), as a native server's
			// ceilings do.
			Resources: corev1.ResourceRequirements{Limits: res, Requests: res.DeepCopy()},
			VolumeMounts: []corev1.VolumeMount{
				{Name: BinVolume, MountPath: BinDir, ReadOnly: true},
				{Name: TLSVolume, MountPath: TLSDir, ReadOnly: true},
				{Name: "workspace", MountPath: "/workspace"},
				{Name: "tmp", MountPath: "/tmp"},
			},
		}},
	}
	if pp.runtimeClass != "" {
		spec.RuntimeClassName = ptr.To(pp.runtimeClass)
	}
	if pp.egressCA {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: EgressCAVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: egressproxy.EgressSecretName(pp.id), DefaultMode: ptr.To(int32(0o444)),
			Items: []corev1.KeyToPath{{Key: egressproxy.CACertKey, Path: path.Base(egressCAPath)}, {Key: EgressBundleKey, Path: path.Base(egressBundlePath)}}}}})
		c := &spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: EgressCAVolume, MountPath: EgressCADir, ReadOnly: true})
	}
	return spec, nil
}
