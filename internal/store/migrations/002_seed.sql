-- Seed catalog (seed 002 "Seeded SKUs", seed 001 "Vendor And Fabric Variants", "OS Image Catalog").

INSERT INTO sku_catalog (sku, vendor, display_name, accelerator_model, capacity_shape, gpus_total,
                         allowed_gpu_counts, gpu_hourly_price_minor, network_fabric, exclusive_node, resource_profile)
VALUES
('h200-sxm-slice', 'NVIDIA', 'NVIDIA H200 GPU VM', 'h200', 'gpu_slice', 8, '{1,2,4,8}', 450, 'infiniband', false,
 '{"fabric": "ib",
   "slice_unit_gpu_count": 1,
   "default_slice_vm_profile": "h200_1g_24c_64g",
   "topology_policy": {"1": "any", "2": "numa_preferred", "4": "numa_required", "8": "full_host"},
   "slice_vm_profiles": {
     "h200_1g_12c_64g":   {"gpu_count": 1, "vcpu_count": 12,  "memory_mib": 65536,  "notes": "early prototype shape"},
     "h200_1g_24c_64g":   {"gpu_count": 1, "vcpu_count": 24,  "memory_mib": 65536,  "notes": "latest tested",
                           "hugepages": {"enabled": true, "page_size": "1G"},
                           "guest_driver_profile": "ubuntu_24_04_nvidia_570_server_rdma"},
     "h200_2g_48c_128g":  {"gpu_count": 2, "vcpu_count": 48,  "memory_mib": 131072, "derived_from": "h200_1g_24c_64g"},
     "h200_4g_96c_256g":  {"gpu_count": 4, "vcpu_count": 96,  "memory_mib": 262144, "derived_from": "h200_1g_24c_64g"},
     "h200_8g_192c_512g": {"gpu_count": 8, "vcpu_count": 192, "memory_mib": 524288, "derived_from": "h200_1g_24c_64g"}
   }}'),
('h200-sxm-baremetal-8g', 'NVIDIA', 'NVIDIA H200 full node', 'h200', 'baremetal', 8, '{8}', 450, 'infiniband', true,
 '{"fabric": "ib"}'),
('amd-mi300x-roce-slice', 'AMD', 'AMD MI300X GPU VM', 'mi300x', 'gpu_slice', 8, '{1,2,4}', 400, 'roce', false,
 '{"fabric": "roce",
   "slice_unit_gpu_count": 1,
   "default_slice_vm_profile": "mi300x_1g_24c_128g",
   "topology_policy": {"1": "any", "2": "numa_preferred", "4": "numa_required"},
   "slice_vm_profiles": {
     "mi300x_1g_24c_128g": {"gpu_count": 1, "vcpu_count": 24, "memory_mib": 131072, "notes": "example RoCE profile"}
   }}');

-- Default vm_slice images (seed 001). They are placeholders until an operator records the
-- published artifact's digest (PATCH /api/v1/admin/os-images/{id}); an image with no digest
-- can never be active, so nothing boots unverified.
INSERT INTO os_images (slug, display_name, version, target, family, architecture, accelerator_vendor,
                       network_fabric, image_format, source_type, source_ref, digest_sha256,
                       default_username, driver_strategy, compatibility_metadata, active)
VALUES
('ubuntu-24.04-gpuaas-slice', 'Ubuntu 24.04 GPUaaS slice', '24.04', 'vm_slice', 'ubuntu', 'amd64', 'any',
 'any', 'qcow2', 'platform_storage', 'images/ubuntu-24.04-gpuaas-slice.qcow2', NULL,
 'ubuntu', 'install_on_boot', '{}', false),
('h200-ubuntu-24.04-gpuaas-slice', 'Ubuntu 24.04 for H200 slices', '24.04', 'vm_slice', 'ubuntu', 'amd64', 'nvidia',
 'infiniband', 'qcow2', 'platform_storage', 'images/h200-ubuntu-24.04-gpuaas-slice.qcow2', NULL,
 'ubuntu', 'preinstalled_nvidia', '{"accelerator_model": "h200", "compatible_skus": ["h200-sxm-slice"]}', false);

---- create above / drop below ----

DELETE FROM os_images WHERE slug IN ('ubuntu-24.04-gpuaas-slice', 'h200-ubuntu-24.04-gpuaas-slice');
DELETE FROM sku_catalog WHERE sku IN ('h200-sxm-slice', 'h200-sxm-baremetal-8g', 'amd-mi300x-roce-slice');
