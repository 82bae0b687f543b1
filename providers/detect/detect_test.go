package detect

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func dmi(t *testing.T, vendor, product string) string {
	t.Helper()
	return host(t, map[string]string{"sys/class/dmi/id/sys_vendor": vendor, "sys/class/dmi/id/product_name": product})
}

// host writes files (path relative to the root: value) under a new root.
func host(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, v := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const (
	dmiDir = "sys/class/dmi/id/"
	// The values ds-identify reads on an Azure VM and on Hyper-V on premises.
	msVendor  = "Microsoft Corporation"
	msProduct = "Virtual Machine"
)

func TestDetect(t *testing.T) {
	empty := t.TempDir()
	tests := []struct {
		name, providerID, root, want, reason string
	}{
		{"aws provider ID", "aws:///us-east-1a/i-0123456789abcdef0", empty, "aws", "providerID"},
		{"gce provider ID", "gce://my-project/us-central1-a/gke-node-1", empty, "gcp", "providerID"},
		{"azure VMSS provider ID", "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/aks-np-1-vmss/virtualMachines/3", empty, "azure", "providerID"},
		{"provider ID wins over DMI", "gce://p/z/n", dmi(t, "Amazon EC2", "m5.large"), "gcp", "providerID"},
		{"kwok provider ID falls back to DMI", "kwok://node-1", dmi(t, "Amazon EC2", "m5.large"), "aws", "sys_vendor"},
		{"EC2 DMI", "", dmi(t, "Amazon EC2", "c6i.xlarge"), "aws", "Amazon EC2"},
		{"older Xen EC2 DMI", "", dmi(t, "Xen", "Amazon EC2 t2.micro"), "aws", "product_name"},
		{"GCE DMI", "", dmi(t, "Google", "Google Compute Engine"), "gcp", "Google"},
		// Issue 13: Hyper-V reports the same vendor and product; only the chassis asset tag is
		// Azure's (cloud-init ds-identify).
		{"Azure DMI", "", host(t, map[string]string{dmiDir + "sys_vendor": msVendor, dmiDir + "product_name": msProduct, dmiDir + "chassis_asset_tag": AzureChassisAssetTag}), "azure", "chassis_asset_tag"},
		{"Azure by the asset tag alone", "", host(t, map[string]string{dmiDir + "chassis_asset_tag": AzureChassisAssetTag}), "azure", AzureChassisAssetTag},
		{"on-premises Hyper-V is none", "", dmi(t, msVendor, msProduct), "none", "Hyper-V"},
		{"Hyper-V with another asset tag is none", "", host(t, map[string]string{dmiDir + "sys_vendor": msVendor, dmiDir + "product_name": msProduct, dmiDir + "chassis_asset_tag": "No Asset Tag"}), "none", "without Azure's chassis_asset_tag"},
		{"Xen EC2 by /sys/hypervisor/uuid", "", host(t, map[string]string{"sys/hypervisor/uuid": "ec2e1916-9099-7caf-fd21-012345abcdef", dmiDir + "sys_vendor": "Xen"}), "aws", "/sys/hypervisor/uuid"},
		{"Xen EC2 by product_uuid, upper case", "", host(t, map[string]string{dmiDir + "product_uuid": "EC2E1916-9099-7CAF-FD21-012345ABCDEF", dmiDir + "sys_vendor": "Xen", dmiDir + "product_name": "HVM domU"}), "aws", "product_uuid"},
		{"Xen EC2 by product_serial", "", host(t, map[string]string{dmiDir + "product_serial": "ec2e1916-9099-7caf-fd21-012345abcdef"}), "aws", "product_serial"},
		{"a Xen host that is not EC2", "", host(t, map[string]string{"sys/hypervisor/uuid": "4b2a3b8e-0000-0000-0000-000000000000", dmiDir + "sys_vendor": "Xen", dmiDir + "product_name": "HVM domU"}), "none", "no cloud"},
		{"Hyper-V desktop is not Azure without the VM product", "", dmi(t, "Microsoft Corporation", "Surface Laptop"), "none", "no cloud"},
		{"bare metal", "", dmi(t, "Dell Inc.", "PowerEdge R640"), "none", "no cloud"},
		{"no DMI at all", "", empty, "none", "no DMI data"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Detect(tc.providerID, tc.root)
			if got.Provider != tc.want {
				t.Errorf("provider = %q, want %q (%s)", got.Provider, tc.want, got.Reason)
			}
			if !strings.Contains(got.Reason, tc.reason) {
				t.Errorf("reason %q does not mention %q", got.Reason, tc.reason)
			}
		})
	}
}

// TestFromHost reads the fixture host roots in testdata/: the cloud comes from DMI alone, with
// no API server, and ok says whether DMI named one (else the caller asks the node's providerID).
func TestFromHost(t *testing.T) {
	tests := []struct {
		root   string
		want   string
		ok     bool
		reason string
	}{
		{"aws-nitro", "aws", true, "Amazon EC2"},
		{"aws-metal", "aws", true, "m5.metal"},
		{"aws-xen", "aws", true, "/sys/hypervisor/uuid"},
		{"gce", "gcp", true, "Google Compute Engine"},
		{"azure", "azure", true, AzureChassisAssetTag},
		{"hyperv-onprem", "none", false, "Hyper-V"},
		{"kvm", "none", false, `sys_vendor "QEMU"`},
		{"baremetal", "none", false, "PowerEdge"},
		{"no-dmi", "none", false, "no DMI data"},
		{"does-not-exist", "none", false, "no DMI data"},
	}
	for _, tc := range tests {
		t.Run(tc.root, func(t *testing.T) {
			got, ok := FromHost(filepath.Join("testdata", tc.root))
			if got.Provider != tc.want || ok != tc.ok {
				t.Errorf("FromHost = %q, %v, want %q, %v (%s)", got.Provider, ok, tc.want, tc.ok, got.Reason)
			}
			if !strings.Contains(got.Reason, tc.reason) {
				t.Errorf("reason %q does not mention %q", got.Reason, tc.reason)
			}
		})
	}
}

// TestFromHostBIOSVendor: bios_vendor alone names the cloud when the other files do not (a
// product name GCE does not guarantee, cloud-init LP #1674861), as systemd's
// detect_vm_dmi_vendor reads it.
func TestFromHostBIOSVendor(t *testing.T) {
	for _, tc := range []struct{ bios, want string }{{"Amazon EC2", "aws"}, {"Google", "gcp"}, {"SeaBIOS", "none"}} {
		root := host(t, map[string]string{dmiDir + "sys_vendor": "", dmiDir + "product_name": "", dmiDir + "bios_vendor": tc.bios})
		if got, _ := FromHost(root); got.Provider != tc.want {
			t.Errorf("bios_vendor %q: %q (%s), want %q", tc.bios, got.Provider, got.Reason, tc.want)
		}
	}
}

// TestDetectFallsBackToHost: Detect with a providerID that names no cloud gives what FromHost
// gives, so that the agent and `reprieve doctor` agree.
func TestDetectFallsBackToHost(t *testing.T) {
	for _, root := range []string{"aws-nitro", "gce", "azure", "hyperv-onprem", "no-dmi"} {
		h, _ := FromHost(filepath.Join("testdata", root))
		for _, id := range []string{"", "kwok://node-1", "kind://docker/kind/kind-worker"} {
			if d := Detect(id, filepath.Join("testdata", root)); d.Provider != h.Provider {
				t.Errorf("Detect(%q, %s) = %q, FromHost = %q", id, root, d.Provider, h.Provider)
			}
		}
	}
}
