package azure

import "testing"

func TestResourceNameFromProviderID(t *testing.T) {
	const prefix = "azure:///subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/MC_prod_prod-aks_westeurope/providers/Microsoft.Compute/"
	tests := []struct {
		name, providerID, want, wantErr string
	}{
		{name: "AKS, Uniform scale set instance", providerID: prefix + "virtualMachineScaleSets/aks-nodepool1-38290525-vmss/virtualMachines/3",
			want: "aks-nodepool1-38290525-vmss_3"},
		{name: "instance ID of several digits", providerID: prefix + "virtualMachineScaleSets/aks-spotpool-38290525-vmss/virtualMachines/1042",
			want: "aks-spotpool-38290525-vmss_1042"},
		{name: "standalone VM", providerID: prefix + "virtualMachines/worker-01", want: "worker-01"},
		{name: "Flexible scale set instance", providerID: prefix + "virtualMachines/flexpool_1a2b3c4d", want: "flexpool_1a2b3c4d"},
		{name: "lower-case segments, as some resource IDs come",
			providerID: "azure:///subscriptions/s/resourcegroups/mc_rg/providers/microsoft.compute/virtualmachinescalesets/aks-pool-1-vmss/virtualmachines/0",
			want:       "aks-pool-1-vmss_0"},
		{name: "upper-case segments and scheme",
			providerID: "AZURE:///SUBSCRIPTIONS/S/RESOURCEGROUPS/RG/PROVIDERS/MICROSOFT.COMPUTE/VIRTUALMACHINESCALESETS/Pool-VMSS/VIRTUALMACHINES/7",
			want:       "Pool-VMSS_7"},
		{name: "names keep their case", providerID: prefix + "virtualMachines/Worker-A", want: "Worker-A"},

		{name: "empty", providerID: "", wantErr: `provider ID "": not an Azure provider ID`},
		{name: "AWS", providerID: "aws:///eu-west-1a/i-0123456789abcdef0", wantErr: "not an Azure provider ID"},
		{name: "kind", providerID: "kind://docker/kind/kind-worker", wantErr: "not an Azure provider ID"},
		{name: "two slashes", providerID: "azure://subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm",
			wantErr: "want azure:/// followed by a resource ID"},
		{name: "scale set without instance", providerID: prefix + "virtualMachineScaleSets/aks-nodepool1-38290525-vmss",
			wantErr: "want .../virtualMachines/<name>"},
		{name: "scale set with empty instance", providerID: prefix + "virtualMachineScaleSets/aks-nodepool1-38290525-vmss/virtualMachines/",
			wantErr: "empty path segment"},
		{name: "trailing slash", providerID: prefix + "virtualMachines/worker-01/", wantErr: "empty path segment"},
		{name: "double slash inside", providerID: "azure:///subscriptions//resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm",
			wantErr: "empty path segment"},
		{name: "extra segment", providerID: prefix + "virtualMachines/worker-01/extensions/x", wantErr: "want .../virtualMachines/<name>"},
		{name: "another resource provider",
			providerID: "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/nic",
			wantErr:    "want /subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/..."},
		{name: "availability set", providerID: prefix + "availabilitySets/as1", wantErr: "want .../virtualMachines/<name>"},
		{name: "no resource group", providerID: "azure:///subscriptions/s/providers/Microsoft.Compute/virtualMachines/vm",
			wantErr: "want /subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/..."},
		{name: "scale set form with a wrong child type", providerID: prefix + "virtualMachineScaleSets/vmss/networkInterfaces/0",
			wantErr: "want .../virtualMachines/<name>"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResourceNameFromProviderID(tc.providerID)
			checkErr(t, err, tc.wantErr)
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
