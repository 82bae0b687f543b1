package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

func indexPod(ns, name, uid, node string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), ResourceVersion: "1"},
		Spec: v1.PodSpec{NodeName: node}}
}

// TestPodIndexLocate: what the index answers for the pod an eviction names, by its UID, through
// each change a watch can bring.
func TestPodIndexLocate(t *testing.T) {
	x := NewPodIndex(nil)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(x.Add(indexPod("team", "web-0", "u-web", "node-a")))
	must(x.Add(indexPod("team", "pending", "u-pending", "")))
	// A pod whose UID and name the index holds, as the watch delivered it trimmed.
	e, _ := x.trim(indexPod("other", "db-0", "u-db", "node-b"))
	must(x.Add(&e))

	type want struct {
		node string
		loc  Location
	}
	check := func(what, ns, name, uid string, w want) {
		t.Helper()
		node, loc := x.Locate(ns, name, types.UID(uid))
		if node != w.node || loc != w.loc {
			t.Errorf("%s: Locate(%s/%s, %s) = %q, %v; want %q, %v", what, ns, name, uid, node, loc, w.node, w.loc)
		}
	}
	check("a bound pod", "team", "web-0", "u-web", want{"node-a", Bound})
	check("a trimmed entry", "other", "db-0", "u-db", want{"node-b", Bound})
	check("a UID never seen", "team", "web-0", "u-new", want{"", Unknown})
	check("a pod not bound yet is not kept", "team", "pending", "u-pending", want{"", Unknown})
	check("another pod's UID", "team", "web-1", "u-web", want{"", OtherPod})
	check("another namespace's pod's UID", "other", "web-0", "u-web", want{"", OtherPod})
	// The hash covers the separator: team/web-0 is not tea/m/web-0.
	check("a name that runs into the namespace", "tea", "m/web-0", "u-web", want{"", OtherPod})

	// The scheduler binds the pending pod: an update.
	must(x.Update(indexPod("team", "pending", "u-pending", "node-c")))
	check("a pod bound since", "team", "pending", "u-pending", want{"node-c", Bound})

	// web-0 is deleted and made again under its name on another node: a new UID. The old UID
	// is gone with the delete; the new one is judged by its own node.
	must(x.Delete(indexPod("team", "web-0", "u-web", "node-a")))
	must(x.Add(indexPod("team", "web-0", "u-web-2", "node-b")))
	check("the old UID of a re-created pod", "team", "web-0", "u-web", want{"", Unknown})
	check("the new UID of a re-created pod", "team", "web-0", "u-web-2", want{"node-b", Bound})
	// A delete the watch missed, as a relist's DeltaFIFO hands it: the last state known.
	must(x.Delete(cache.DeletedFinalStateUnknown{Key: "other/db-0", Obj: &e}))
	check("a pod deleted while the watch was down", "other", "db-0", "u-db", want{"", Unknown})
	// Anything else is ignored, not an error: the store must not stop the reflector.
	must(x.Add(&v1.Node{}))
	must(x.Delete("not a pod"))
	if n := x.Len(); n != 2 {
		t.Errorf("the index holds %d pods; want 2 (pending, and web-0's new UID)", n)
	}
}

// TestPodIndexReplace: a full list replaces what the index held, marks it synced (ready) and sets
// its gauges; the transform trims a pod to its entry and lets other objects pass.
func TestPodIndexReplace(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewIndexMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	x := NewPodIndex(m)
	if x.Synced() || x.IndexReady() == nil {
		t.Fatal("a new index says it is synced")
	}
	if err := x.Add(indexPod("ns", "gone", "u-gone", "n1")); err != nil {
		t.Fatal(err)
	}
	tr := x.Transformer()
	trimmed, err := tr(indexPod("ns", "b", "u-b", "n2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := trimmed.(*indexedPod); !ok {
		t.Fatalf("the transform made a %T of a pod; want *indexedPod", trimmed)
	}
	if again, _ := tr(trimmed); again != trimmed {
		t.Error("the transform changed an entry it made")
	}
	if node, _ := tr(&v1.Node{}); node == nil {
		t.Error("the transform dropped an object that is no pod")
	}
	if err := x.Replace([]any{indexPod("ns", "a", "u-a", "n1"), trimmed, indexPod("ns", "unbound", "u-c", "")}, "7"); err != nil {
		t.Fatal(err)
	}
	if !x.Synced() || x.IndexReady() != nil {
		t.Error("the index is not synced after a full list")
	}
	for _, c := range []struct {
		name, uid, node string
		loc             Location
	}{{"a", "u-a", "n1", Bound}, {"b", "u-b", "n2", Bound}, {"gone", "u-gone", "", Unknown}, {"unbound", "u-c", "", Unknown}} {
		if node, loc := x.Locate("ns", c.name, types.UID(c.uid)); node != c.node || loc != c.loc {
			t.Errorf("after the list, Locate(ns/%s) = %q, %v; want %q, %v", c.name, node, loc, c.node, c.loc)
		}
	}
	if got := testutil.ToFloat64(m.Pods); got != 2 {
		t.Errorf("reprieve_guard_index_pods = %v; want 2", got)
	}
	if got := testutil.ToFloat64(m.Synced); got != 1 {
		t.Errorf("reprieve_guard_index_synced = %v; want 1", got)
	}
}

// fakePods is a list and watch of pods for a reflector: the list it serves, a watch the test
// feeds, and failures on demand. With sendInitialEvents it streams the list as a watch-list
// does (ADDED events, then the bookmark that ends them).
type fakePods struct {
	mu      sync.Mutex
	list    []v1.Pod
	rv      string
	fail    error
	lists   int
	watches chan *watch.FakeWatcher
	failed  chan struct{}
}

func (f *fakePods) listFn(_ context.Context, o metav1.ListOptions) (*v1.PodList, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if o.FieldSelector != IndexSelector {
		return nil, errors.New("the index listed without its field selector")
	}
	f.lists++
	if f.fail != nil {
		f.failed <- struct{}{}
		return nil, f.fail
	}
	return &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: f.rv}, Items: append([]v1.Pod(nil), f.list...)}, nil
}

func (f *fakePods) watchFn(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if o.FieldSelector != IndexSelector {
		return nil, errors.New("the index watched without its field selector")
	}
	if f.fail != nil {
		f.failed <- struct{}{}
		return nil, f.fail
	}
	w := watch.NewFakeWithChanSize(len(f.list)+1, false)
	if o.SendInitialEvents != nil && *o.SendInitialEvents {
		for i := range f.list {
			w.Add(&f.list[i])
		}
		w.Action(watch.Bookmark, &v1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: f.rv,
			Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
	}
	f.watches <- w
	return w, nil
}

// notWatchList is a client without watch-list semantics, so that the reflector lists.
type notWatchList struct{}

func (notWatchList) IsWatchListSemanticsUnSupported() bool { return true }

// TestPodIndexOnAReflector runs the index under client-go's reflector, through a streamed
// watch-list and through a plain list: it syncs, follows the watch, and, while the list and watch
// fail, keeps what it had and stays ready.
func TestPodIndexOnAReflector(t *testing.T) {
	for _, mode := range []string{"watch-list", "list"} {
		t.Run(mode, func(t *testing.T) {
			f := &fakePods{rv: "10", watches: make(chan *watch.FakeWatcher, 4), failed: make(chan struct{}, 16),
				list: []v1.Pod{*indexPod("ns", "a", "u-a", "n1"), *indexPod("ns", "b", "u-b", "n2")}}
			reg := prometheus.NewRegistry()
			m, err := NewIndexMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			x := NewPodIndex(m)
			changed := make(chan struct{}, 64)
			x.changed = func() {
				select {
				case changed <- struct{}{}:
				default:
				}
			}
			var lw cache.ListerWatcher = x.ListWatch(f.listFn, f.watchFn)
			if mode == "list" {
				lw = cache.ToListWatcherWithWatchListSemantics(lw.(*cache.ListWatch), notWatchList{})
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); x.Run(ctx, lw) }()
			defer func() { cancel(); <-done }()
			await := func(what string, ch <-chan struct{}, cond func() bool) {
				t.Helper()
				deadline := time.After(30 * time.Second)
				for !cond() {
					select {
					case <-ch:
					case <-deadline:
						t.Fatalf("waiting for %s", what)
					}
				}
			}
			var w *watch.FakeWatcher
			select {
			case w = <-f.watches:
			case <-time.After(30 * time.Second):
				t.Fatal("the reflector never watched")
			}
			await("the first list", changed, x.Synced)
			if node, loc := x.Locate("ns", "b", "u-b"); node != "n2" || loc != Bound {
				t.Errorf("after the list: %q, %v; want n2, bound", node, loc)
			}
			f.mu.Lock()
			if listed := f.lists > 0; listed != (mode == "list") {
				t.Errorf("%s: %d lists; want the list only where there is no watch-list", mode, f.lists)
			}
			f.mu.Unlock()
			w.Add(indexPod("ns", "c", "u-c", "n3"))
			await("the added pod", changed, func() bool { _, loc := x.Locate("ns", "c", "u-c"); return loc == Bound })
			w.Delete(indexPod("ns", "a", "u-a", "n1"))
			await("the deleted pod", changed, func() bool { _, loc := x.Locate("ns", "a", "u-a"); return loc == Unknown })

			// The watch goes, and every list and watch after it fails (the API server unreachable).
			f.mu.Lock()
			f.fail = errors.New("connection refused")
			f.mu.Unlock()
			w.Stop()
			await("a failed list or watch", f.failed, func() bool { return testutil.ToFloat64(m.ListWatchErrors) > 0 })
			if node, loc := x.Locate("ns", "c", "u-c"); node != "n3" || loc != Bound {
				t.Errorf("with the watch down: %q, %v; want what the index knew, n3, bound", node, loc)
			}
			if _, loc := x.Locate("ns", "d", "u-d"); loc != Unknown {
				t.Errorf("with the watch down, a pod never seen is %v; want unknown (read by the handler)", loc)
			}
			if err := x.IndexReady(); err != nil {
				t.Errorf("with the watch down after its first list, the guard is not ready: %v", err)
			}
		})
	}
}

// TestPodListWatchCounts: a list or watch that fails to start counts once, with its selector set.
func TestPodListWatchCounts(t *testing.T) {
	m, err := NewIndexMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var sel []string
	boom := errors.New("forbidden")
	lw := NewPodIndex(m).ListWatch(func(_ context.Context, o metav1.ListOptions) (*v1.PodList, error) {
		sel = append(sel, o.FieldSelector)
		return nil, boom
	}, func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
		sel = append(sel, o.FieldSelector)
		return nil, boom
	})
	obj, err := lw.ListWithContext(context.Background(), metav1.ListOptions{})
	if !errors.Is(err, boom) || obj != nil {
		t.Errorf("the list: %v, %v; want nil and the error", obj, err)
	}
	if _, err := lw.Watch(metav1.ListOptions{}); !errors.Is(err, boom) {
		t.Errorf("the watch: %v; want the error", err)
	}
	if got := testutil.ToFloat64(m.ListWatchErrors); got != 2 {
		t.Errorf("reprieve_guard_index_list_watch_errors_total = %v; want 2", got)
	}
	for _, s := range sel {
		if s != IndexSelector {
			t.Errorf("field selector %q; want %q", s, IndexSelector)
		}
	}
}

// TestPodIndexListsPageByPage: the index's list reads pages of indexListPage pods from the most
// recent state, whatever version the reflector asks for (a list from the watch cache would come
// whole, ignoring the limit), and hands the reflector the pods trimmed, with the last page's
// resource version.
func TestPodIndexListsPageByPage(t *testing.T) {
	const n = 2*indexListPage + 7
	var asked []metav1.ListOptions
	x := NewPodIndex(nil)
	lw := x.ListWatch(func(_ context.Context, o metav1.ListOptions) (*v1.PodList, error) {
		asked = append(asked, o)
		from := 0
		if o.Continue != "" {
			if _, err := fmt.Sscan(o.Continue, &from); err != nil {
				return nil, err
			}
		}
		l := &v1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: fmt.Sprint(100 + from)}}
		for i := from; i < min(n, from+int(o.Limit)); i++ {
			l.Items = append(l.Items, *indexPod("ns", fmt.Sprint("p", i), fmt.Sprint("u", i), "n"))
		}
		if next := from + int(o.Limit); next < n {
			l.Continue = fmt.Sprint(next)
		}
		return l, nil
	}, nil)
	obj, err := lw.ListWithContext(context.Background(), metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(asked) != 3 {
		t.Fatalf("%d pages read; want 3", len(asked))
	}
	for i, o := range asked {
		if o.Limit != indexListPage || o.ResourceVersion != "" || o.FieldSelector != IndexSelector {
			t.Errorf("page %d asked with %+v; want limit %d, the most recent state, the index's selector", i, o, indexListPage)
		}
	}
	rv, err := meta.ListAccessor(obj)
	if err != nil {
		t.Fatal(err)
	}
	if rv.GetResourceVersion() != fmt.Sprint(100+2*indexListPage) {
		t.Errorf("the list's resource version %q; want the last page's", rv.GetResourceVersion())
	}
	items, err := meta.ExtractList(obj)
	if err != nil {
		t.Fatal(err)
	}
	found := make([]any, len(items))
	for i := range items {
		found[i] = items[i]
	}
	if err := x.Replace(found, rv.GetResourceVersion()); err != nil {
		t.Fatal(err)
	}
	if x.Len() != n {
		t.Errorf("the index holds %d pods; want %d", x.Len(), n)
	}
	if node, loc := x.Locate("ns", fmt.Sprint("p", n-1), types.UID(fmt.Sprint("u", n-1))); node != "n" || loc != Bound {
		t.Errorf("the last page's last pod: %q, %v; want bound to n", node, loc)
	}
}
