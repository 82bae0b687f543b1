package detect

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func dmi(t *testing.T, vendor, product string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "sys", "class", "dmi", "id")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"sys_vendor": vendor, "product_name": product} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

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
		{"Azure DMI", "", dmi(t, "Microsoft Corporation", "Virtual Machine"), "azure", "Microsoft"},
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
