package egressproxy

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// namespaceNameLabel is set by Kubernetes on every namespace to its name.
const namespaceNameLabel = "kubernetes.io/metadata.name"

// PolicyConfig says where the parties of the sandbox network live.
type PolicyConfig struct {
	// SandboxNamespace holds the sandbox pods.
	SandboxNamespace string
	// ServerNamespace and ServerLabels select the airlock server pods, the
	// only ones that may reach an agent (on AgentPort).
	ServerNamespace string
	ServerLabels    map[string]string
	// ProxyNamespace and ProxyLabels select the egress proxy pods, the
	// only destination of a sandbox pod (on HTTPPort and SOCKSPort).
	ProxyNamespace string
	ProxyLabels    map[string]string
	// AgentPort, HTTPPort and SOCKSPort default to 7070, 3128 and 1080.
	AgentPort, HTTPPort, SOCKSPort int32
}

// Names of the NetworkPolicies NetworkPolicies builds.
const (
	SandboxPolicyName = "airlock-sandboxes"
	ProxyPolicyName   = "airlock-egress-proxy"
)

// NetworkPolicies builds the policies that confine sandbox pods:
//
//   - SandboxPolicyName, in the sandbox namespace, selects every pod with
//     the label LabelSandbox and allows ingress only from the server pods
//     to the agent port, and egress only to the proxy pods on the proxy
//     ports: no DNS (the proxy resolves names), no other pod, no node, no
//     cloud metadata address, no outside address;
//   - ProxyPolicyName, in the proxy namespace, allows ingress to the proxy
//     pods only from sandbox pods, on the proxy ports (the proxy's own
//     egress, to the outside, DNS and the API server, is left open).
//
// The policies are enforced only by a network plugin that implements
// NetworkPolicy (Calico, Cilium, ...); kindnet and flannel alone do not.
func NetworkPolicies(c PolicyConfig) ([]*networkingv1.NetworkPolicy, error) {
	if c.SandboxNamespace == "" || c.ServerNamespace == "" || c.ProxyNamespace == "" {
		return nil, fmt.Errorf("egressproxy: network policies: the sandbox, server and proxy namespaces are required")
	}
	if len(c.ServerLabels) == 0 || len(c.ProxyLabels) == 0 {
		return nil, fmt.Errorf("egressproxy: network policies: server and proxy labels are required (an empty selector would select every pod)")
	}
	if c.AgentPort == 0 {
		c.AgentPort = 7070
	}
	if c.HTTPPort == 0 {
		c.HTTPPort = HTTPPort
	}
	if c.SOCKSPort == 0 {
		c.SOCKSPort = SOCKSPort
	}
	port := func(n int32) networkingv1.NetworkPolicyPort {
		proto := corev1.ProtocolTCP
		p := intstr.FromInt32(n)
		return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &p}
	}
	inNamespace := func(ns string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{namespaceNameLabel: ns}}
	}
	sandboxes := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: LabelSandbox, Operator: metav1.LabelSelectorOpExists},
	}}
	managed := map[string]string{"app.kubernetes.io/managed-by": "airlock"}
	sandbox := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: SandboxPolicyName, Namespace: c.SandboxNamespace, Labels: managed},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: sandboxes,
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: inNamespace(c.ServerNamespace),
					PodSelector:       &metav1.LabelSelector{MatchLabels: c.ServerLabels},
				}},
				Ports: []networkingv1.NetworkPolicyPort{port(c.AgentPort)},
			}},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: inNamespace(c.ProxyNamespace),
					PodSelector:       &metav1.LabelSelector{MatchLabels: c.ProxyLabels},
				}},
				Ports: []networkingv1.NetworkPolicyPort{port(c.HTTPPort), port(c.SOCKSPort)},
			}},
		},
	}
	proxy := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: ProxyPolicyName, Namespace: c.ProxyNamespace, Labels: managed},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: c.ProxyLabels},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: inNamespace(c.SandboxNamespace),
					PodSelector:       &sandboxes,
				}},
				Ports: []networkingv1.NetworkPolicyPort{port(c.HTTPPort), port(c.SOCKSPort)},
			}},
		},
	}
	return []*networkingv1.NetworkPolicy{sandbox, proxy}, nil
}
