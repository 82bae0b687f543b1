// Command csi-registrar registers a CSI driver with the kubelet, for test/realnode's volume test
// (issue 40): what kubernetes-csi's node-driver-registrar does, which the Go module proxy does not
// serve. Like node-driver-registrar (cmd/csi-node-driver-registrar, its nodeRegister and
// registrationServer), it serves the kubelet's plugin registration API
// (k8s.io/kubelet/pkg/apis/pluginregistration/v1) on a socket named <driver>-reg.sock in the
// kubelet's plugins_registry folder, where the kubelet's plugin watcher finds it; GetInfo
// answers the plugin type CSIPlugin, the driver's name, the endpoint of the driver's own CSI
// socket and the supported versions ("1.0.0"); NotifyRegistrationStatus logs the kubelet's
// verdict. The kubelet then calls the driver's NodeGetInfo itself and writes the node's
// CSINode. It runs until SIGTERM or SIGINT, and removes its socket then.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type server struct {
	registerapi.UnimplementedRegistrationServer
	driver, endpoint string
}

func (s *server) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	log.Printf("GetInfo from the kubelet: %s at %s", s.driver, s.endpoint)
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: s.driver, Endpoint: s.endpoint,
		SupportedVersions: []string{"1.0.0"}}, nil
}

func (s *server) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.PluginRegistered {
		log.Printf("registered with the kubelet")
	} else {
		log.Printf("the kubelet refused the registration: %s", st.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func main() {
	driver := flag.String("driver", "", "the CSI driver's name")
	endpoint := flag.String("csi-endpoint", "", "the path of the driver's CSI socket, as the kubelet is to reach it")
	dir := flag.String("registration-dir", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registration folder")
	flag.Parse()
	if err := run(*driver, *endpoint, *dir); err != nil {
		fmt.Fprintf(os.Stderr, "csi-registrar: %v\n", err)
		os.Exit(1)
	}
}

func run(driver, endpoint, dir string) error {
	if driver == "" || endpoint == "" {
		return fmt.Errorf("-driver and -csi-endpoint are required")
	}
	sock := filepath.Join(dir, driver+"-reg.sock")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("creating the registration folder: %w", err)
	}
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", sock, err)
	}
	defer os.Remove(sock)
	g := grpc.NewServer()
	registerapi.RegisterRegistrationServer(g, &server{driver: driver, endpoint: endpoint})
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		g.Stop()
	}()
	log.Printf("serving the registration of %s on %s", driver, sock)
	if err := g.Serve(l); err != nil {
		return fmt.Errorf("serving: %w", err)
	}
	return nil
}
