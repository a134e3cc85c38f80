package egressproxy

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Watch keeps s in line with the sandbox pods (label LabelSandbox) and the
// egress Secrets (label LabelPurpose=PurposeEgress) of namespace, through
// client-go informers, until ctx ends. It returns once the caches have
// synced and the initial state is applied; the watch goes on in the
// background. Events are reduced to sandbox ids and handled one id at a
// time by a single worker that reads the current pods and Secret from the
// caches, so that no stale event overwrites a newer state.
func Watch(ctx context.Context, cs kubernetes.Interface, namespace string, s *Server) error {
	podF := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelSandbox }))
	secF := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelPurpose + "=" + PurposeEgress }))
	pods, secrets := podF.Core().V1().Pods(), secF.Core().V1().Secrets()
	queue := workqueue.NewTyped[string]()
	context.AfterFunc(ctx, queue.ShutDown)

	enqueue := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if m, ok := obj.(metav1.Object); ok {
			if id := m.GetLabels()[LabelSandbox]; id != "" {
				queue.Add(id)
			}
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}
	if _, err := pods.Informer().AddEventHandler(handler); err != nil {
		return fmt.Errorf("egressproxy: watch pods: %w", err)
	}
	if _, err := secrets.Informer().AddEventHandler(handler); err != nil {
		return fmt.Errorf("egressproxy: watch secrets: %w", err)
	}
	podF.Start(ctx.Done())
	secF.Start(ctx.Done())
	for _, ok := range podF.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("egressproxy: pods of namespace %s: cache did not sync: %w", namespace, context.Cause(ctx))
		}
	}
	for _, ok := range secF.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("egressproxy: secrets of namespace %s: cache did not sync: %w", namespace, context.Cause(ctx))
		}
	}
	w := &watcher{s: s, ns: namespace, pods: pods.Lister(), secrets: secrets.Lister()}
	// The initial state, before Watch returns; later events arrive through
	// the queue (ids already handled here are handled again, harmlessly).
	for queue.Len() > 0 {
		id, _ := queue.Get()
		w.sync(id)
		queue.Done(id)
	}
	go func() {
		for {
			id, shutdown := queue.Get()
			if shutdown {
				return
			}
			w.sync(id)
			queue.Done(id)
		}
	}()
	return nil
}

// watcher applies the caches' state of one sandbox to the Server.
type watcher struct {
	s       *Server
	ns      string
	pods    listersv1.PodLister
	secrets listersv1.SecretLister
}

// sync makes the Server's view of sandbox id match the caches.
func (w *watcher) sync(id string) {
	sel := labels.SelectorFromSet(labels.Set{LabelSandbox: id})
	pods, err := w.pods.Pods(w.ns).List(sel)
	if err != nil {
		w.s.log.Error("egress-proxy: list pods", "sandbox", id, "err", err)
		return
	}
	var secret *corev1.Secret
	sec, err := w.secrets.Secrets(w.ns).Get(EgressSecretName(id))
	switch {
	case err == nil && sec.Labels[LabelSandbox] == id:
		secret = sec
	case err == nil:
		w.s.log.Error("egress-proxy: egress Secret labelled for another sandbox; ignored", "sandbox", id, "secret", sec.Name)
	case !apierrors.IsNotFound(err):
		w.s.log.Error("egress-proxy: get egress Secret", "sandbox", id, "err", err)
	}
	live := make(map[types.UID]bool, len(pods))
	for _, pod := range pods {
		live[pod.UID] = true
		if err := w.s.SyncPod(pod, secret); err != nil {
			w.s.log.Error("egress-proxy: sandbox pod", "sandbox", id, "pod", pod.Name, "err", err)
		}
	}
	for _, uid := range w.s.podsOf(id) {
		if !live[uid] {
			w.s.ForgetPod(uid)
		}
	}
}

// podsOf lists the pods the Server knows for sandbox id.
func (s *Server) podsOf(id string) []types.UID {
	s.mu.Lock()
	defer s.mu.Unlock()
	var uids []types.UID
	for uid, e := range s.pods {
		if e.id == id {
			uids = append(uids, uid)
		}
	}
	return uids
}
