package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/store"
)

// The control plane of this package's tests: one real kube-apiserver and
// etcd (controller-runtime's envtest, binaries from scripts/kube-assets.sh)
// for the whole package, with agent-sandbox's CRDs and deploy/airlock's
// namespaces and RBAC applied. There is no kubelet and no agent-sandbox
// controller: the tests check what the control plane holds.
var (
	testEnv   *envtest.Environment
	adminCfg  *rest.Config
	admin     client.Client // cluster admin (system:masters)
	serverCfg *rest.Config  // the ServiceAccount airlock/airlock-server, bound only by deploy/airlock/rbac.yaml
	envErr    error         // why there is no control plane (tests skip with it)
)

// sandboxNS is the sandboxes' namespace of deploy/airlock.
const sandboxNS = "airlock-sandboxes"

func TestMain(m *testing.M) {
	code := func() int {
		defer testserver.Cleanup()
		dir, err := AssetsDir()
		if err != nil {
			if os.Geteuid() != 0 {
				envErr = fmt.Errorf("not root, and %w", err)
				fmt.Fprintf(os.Stderr, "kube: control-plane tests SKIPPED (not root): %v\n", err)
				return m.Run()
			}
			fmt.Fprintf(os.Stderr, "kube: control-plane tests FAIL: %v\n", err)
			return 1
		}
		if err := startEnv(dir); err != nil {
			fmt.Fprintf(os.Stderr, "kube: control-plane tests FAIL: start kube-apiserver and etcd from %s: %v\n", dir, err)
			if testEnv != nil {
				testEnv.Stop()
			}
			return 1
		}
		defer testEnv.Stop()
		return m.Run()
	}()
	os.Exit(code)
}

func startEnv(dir string) error {
	s, err := Scheme()
	if err != nil {
		return err
	}
	testEnv = &envtest.Environment{
		CRDDirectoryPaths:        []string{filepath.Join("..", "deploy", "agent-sandbox", "k8s", "crds")},
		ErrorIfCRDPathMissing:    true,
		BinaryAssetsDirectory:    dir,
		Scheme:                   s,
		ControlPlaneStartTimeout: 3 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	if adminCfg, err = testEnv.Start(); err != nil {
		return err
	}
	if admin, err = client.New(adminCfg, client.Options{Scheme: s}); err != nil {
		return err
	}
	ctx := context.Background()
	for _, f := range []string{"namespace.yaml", "rbac.yaml"} {
		if err := applyFile(ctx, admin, filepath.Join("..", "deploy", "airlock", f)); err != nil {
			return err
		}
	}
	u, err := testEnv.AddUser(envtestUser("system:serviceaccount:airlock:airlock-server"), nil)
	if err != nil {
		return fmt.Errorf("add the server's user: %w", err)
	}
	serverCfg = u.Config()
	return nil
}

// applyFile creates every object of a multi-document YAML file.
func applyFile(ctx context.Context, c client.Client, path string) error {
	objs, err := decodeFile(path)
	if err != nil {
		return err
	}
	for _, u := range objs {
		if err := c.Create(ctx, u); err != nil {
			return fmt.Errorf("%s: create %s %s: %w", path, u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

// decodeFile returns the objects of a multi-document YAML file.
func decodeFile(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// needEnv skips t when there is no control plane (only when not root; as
// root TestMain fails instead).
func needEnv(t *testing.T) {
	t.Helper()
	if envErr != nil {
		t.Skipf("no control plane: %v", envErr)
	}
}

// serverClient is a client with the rights of deploy/airlock/rbac.yaml only.
func serverClient(t *testing.T) client.Client {
	t.Helper()
	c, err := NewClient(serverCfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// replica is one airlock server's Manager on the kubernetes backend, as
// the ServiceAccount of deploy/airlock.
type replica struct {
	m  *manager.Manager
	b  *Backend
	st *store.Store
}

func newReplica(t *testing.T, mut func(*Config)) *replica {
	t.Helper()
	return newReplicaCeilings(t, mut, policy.Ceilings{})
}

// newReplicaCeilings is newReplica with the server's ceilings (--max-memory...).
func newReplicaCeilings(t *testing.T, mut func(*Config), ceil policy.Ceilings) *replica {
	t.Helper()
	cfg := Config{Client: serverClient(t), Namespace: sandboxNS, AgentImage: "registry.test/airlock:1",
		DefaultImage: "registry.test/python:3", Logf: t.Logf}
	if mut != nil {
		mut(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := manager.Open(manager.Config{StateDir: dir, Store: st, AgentBinary: "/airlock", Backend: b, Logf: t.Logf, Ceilings: ceil})
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	r := &replica{m: m, b: b, st: st}
	t.Cleanup(r.close)
	return r
}

// close stops the replica as a killed server would leave things: the
// sandboxes stay in the API.
func (r *replica) close() {
	if r.m != nil {
		r.m.Close()
		r.st.Close()
		r.m = nil
	}
}

// envtestUser is a ServiceAccount-like user of the test control plane.
func envtestUser(name string) envtest.User {
	return envtest.User{Name: name, Groups: []string{"system:serviceaccounts", "system:authenticated"}}
}
