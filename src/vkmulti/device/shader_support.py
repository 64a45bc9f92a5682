"""What a kernel module declares (OpCapability, OpExtension, the LocalSizeId execution
mode) against what its device was made with: a module may use a capability only
where the VkDevice enabled a feature, an extension or a core version that allows it,
or the device reports a property that does (the Vulkan specification's "SPIR-V
Environment" appendix). spirv-val knows no device, and a driver given a module
that needs more than its device enabled has undefined behaviour, so vkmulti
refuses it first, with UnsupportedError naming the capability, the device and what
would allow it.

The tables are the Vulkan registry's (vk.xml, 1.3.239: <spirvcapabilities> and
<spirvextensions>), capability names keyed by their SPIR-V numbers (aliases of one
number merged). An alternative
is a core version ("1.2"), a feature ("f:shaderInt64"), an enabled device extension
("e:VK_KHR_ray_query"), a subgroup operation compute shaders support ("s:VOTE", with
"&e:..." when it also needs an extension) or a float-controls property that is true
for some width ("p:shaderDenormPreserve"). A capability or extension the tables do
not hold is refused.

What a device enabled: DeviceSlot.enabled_extensions, and DeviceSlot.enabled_features
(the features vkmulti enabled on the devices it made; those an engine named in
primary_features; None for an engine's device handed over without them, where no
feature can be assumed enabled).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import vulkan as vk

from .._core.checks import short_repr
from ..errors import UnsupportedError

__all__ = ["ShaderSupport", "DeclaredShader", "check_device_support", "LOCAL_SIZE_ID_FEATURE"]

_ffi = vk.ffi
#: The feature the LocalSizeId execution mode needs (VUID-RuntimeSpirv-LocalSizeId-06434).
LOCAL_SIZE_ID_FEATURE = "maintenance4"
_SUBGROUP_BITS = {"BASIC": 0x1, "VOTE": 0x2, "ARITHMETIC": 0x4, "BALLOT": 0x8, "SHUFFLE": 0x10,
                  "SHUFFLE_RELATIVE": 0x20, "CLUSTERED": 0x40, "QUAD": 0x80, "PARTITIONED_NV": 0x100}
_FLOAT_CONTROLS = ("shaderSignedZeroInfNanPreserve", "shaderDenormPreserve", "shaderDenormFlushToZero",
                   "shaderRoundingModeRTE", "shaderRoundingModeRTZ")

#: SPIR-V capability number -> (name, the alternatives that allow it)
_CAPABILITIES: dict[int, tuple[str, tuple[str, ...]]] = {
    0: ('Matrix', ('1.0',)),
    1: ('Shader', ('1.0',)),
    2: ('Geometry', ('f:geometryShader',)),
    3: ('Tessellation', ('f:tessellationShader',)),
    9: ('Float16', ('f:shaderFloat16', 'e:VK_AMD_gpu_shader_half_float')),
    10: ('Float64', ('f:shaderFloat64',)),
    11: ('Int64', ('f:shaderInt64',)),
    12: ('Int64Atomics', ('f:shaderBufferInt64Atomics', 'f:shaderSharedInt64Atomics', 'f:shaderImageInt64Atomics')),
    22: ('Int16', ('f:shaderInt16',)),
    23: ('TessellationPointSize', ('f:shaderTessellationAndGeometryPointSize',)),
    24: ('GeometryPointSize', ('f:shaderTessellationAndGeometryPointSize',)),
    25: ('ImageGatherExtended', ('f:shaderImageGatherExtended',)),
    27: ('StorageImageMultisample', ('f:shaderStorageImageMultisample',)),
    28: ('UniformBufferArrayDynamicIndexing', ('f:shaderUniformBufferArrayDynamicIndexing',)),
    29: ('SampledImageArrayDynamicIndexing', ('f:shaderSampledImageArrayDynamicIndexing',)),
    30: ('StorageBufferArrayDynamicIndexing', ('f:shaderStorageBufferArrayDynamicIndexing',)),
    31: ('StorageImageArrayDynamicIndexing', ('f:shaderStorageImageArrayDynamicIndexing',)),
    32: ('ClipDistance', ('f:shaderClipDistance',)),
    33: ('CullDistance', ('f:shaderCullDistance',)),
    34: ('ImageCubeArray', ('f:imageCubeArray',)),
    35: ('SampleRateShading', ('f:sampleRateShading',)),
    39: ('Int8', ('f:shaderInt8',)),
    40: ('InputAttachment', ('1.0',)),
    41: ('SparseResidency', ('f:shaderResourceResidency',)),
    42: ('MinLod', ('f:shaderResourceMinLod',)),
    43: ('Sampled1D', ('1.0',)),
    44: ('Image1D', ('1.0',)),
    45: ('SampledCubeArray', ('f:imageCubeArray',)),
    46: ('SampledBuffer', ('1.0',)),
    47: ('ImageBuffer', ('1.0',)),
    48: ('ImageMSArray', ('f:shaderStorageImageMultisample',)),
    49: ('StorageImageExtendedFormats', ('1.0',)),
    50: ('ImageQuery', ('1.0',)),
    51: ('DerivativeControl', ('1.0',)),
    52: ('InterpolationFunction', ('f:sampleRateShading',)),
    53: ('TransformFeedback', ('f:transformFeedback',)),
    54: ('GeometryStreams', ('f:geometryStreams',)),
    55: ('StorageImageReadWithoutFormat',
         ('f:shaderStorageImageReadWithoutFormat', '1.3', 'e:VK_KHR_format_feature_flags2')),
    56: ('StorageImageWriteWithoutFormat',
         ('f:shaderStorageImageWriteWithoutFormat', '1.3', 'e:VK_KHR_format_feature_flags2')),
    57: ('MultiViewport', ('f:multiViewport',)),
    61: ('GroupNonUniform', ('s:BASIC',)),
    62: ('GroupNonUniformVote', ('s:VOTE',)),
    63: ('GroupNonUniformArithmetic', ('s:ARITHMETIC',)),
    64: ('GroupNonUniformBallot', ('s:BALLOT',)),
    65: ('GroupNonUniformShuffle', ('s:SHUFFLE',)),
    66: ('GroupNonUniformShuffleRelative', ('s:SHUFFLE_RELATIVE',)),
    67: ('GroupNonUniformClustered', ('s:CLUSTERED',)),
    68: ('GroupNonUniformQuad', ('s:QUAD',)),
    69: ('ShaderLayer', ('f:shaderOutputLayer',)),
    70: ('ShaderViewportIndex', ('f:shaderOutputViewportIndex',)),
    4165: ('CoreBuiltinsARM', ('f:shaderCoreBuiltins',)),
    4422: ('FragmentShadingRateKHR',
           ('f:pipelineFragmentShadingRate', 'f:primitiveFragmentShadingRate', 'f:attachmentFragmentShadingRate')),
    4423: ('SubgroupBallotKHR', ('e:VK_EXT_shader_subgroup_ballot',)),
    4427: ('DrawParameters', ('f:shaderDrawParameters', 'e:VK_KHR_shader_draw_parameters')),
    4428: ('WorkgroupMemoryExplicitLayoutKHR', ('f:workgroupMemoryExplicitLayout',)),
    4429: ('WorkgroupMemoryExplicitLayout8BitAccessKHR', ('f:workgroupMemoryExplicitLayout8BitAccess',)),
    4430: ('WorkgroupMemoryExplicitLayout16BitAccessKHR', ('f:workgroupMemoryExplicitLayout16BitAccess',)),
    4431: ('SubgroupVoteKHR', ('e:VK_EXT_shader_subgroup_vote',)),
    4433: ('StorageBuffer16BitAccess', ('f:storageBuffer16BitAccess',)),
    4434: ('UniformAndStorageBuffer16BitAccess', ('f:uniformAndStorageBuffer16BitAccess',)),
    4435: ('StoragePushConstant16', ('f:storagePushConstant16',)),
    4436: ('StorageInputOutput16', ('f:storageInputOutput16',)),
    4437: ('DeviceGroup', ('1.1', 'e:VK_KHR_device_group')),
    4439: ('MultiView', ('f:multiview',)),
    4441: ('VariablePointersStorageBuffer', ('f:variablePointersStorageBuffer',)),
    4442: ('VariablePointers', ('f:variablePointers',)),
    4447: ('SampleMaskPostDepthCoverage', ('e:VK_EXT_post_depth_coverage',)),
    4448: ('StorageBuffer8BitAccess', ('f:storageBuffer8BitAccess',)),
    4449: ('UniformAndStorageBuffer8BitAccess', ('f:uniformAndStorageBuffer8BitAccess',)),
    4450: ('StoragePushConstant8', ('f:storagePushConstant8',)),
    4464: ('DenormPreserve', ('p:shaderDenormPreserve',)),
    4465: ('DenormFlushToZero', ('p:shaderDenormFlushToZero',)),
    4466: ('SignedZeroInfNanPreserve', ('p:shaderSignedZeroInfNanPreserve',)),
    4467: ('RoundingModeRTE', ('p:shaderRoundingModeRTE',)),
    4468: ('RoundingModeRTZ', ('p:shaderRoundingModeRTZ',)),
    4472: ('RayQueryKHR', ('f:rayQuery',)),
    4478: ('RayTraversalPrimitiveCullingKHR', ('f:rayTraversalPrimitiveCulling', 'f:rayQuery')),
    4479: ('RayTracingKHR', ('f:rayTracingPipeline',)),
    5009: ('ImageGatherBiasLodAMD', ('e:VK_AMD_texture_gather_bias_lod',)),
    5010: ('FragmentMaskAMD', ('e:VK_AMD_shader_fragment_mask',)),
    5013: ('StencilExportEXT', ('e:VK_EXT_shader_stencil_export',)),
    5015: ('ImageReadWriteLodAMD', ('e:VK_AMD_shader_image_load_store_lod',)),
    5016: ('Int64ImageEXT', ('f:shaderImageInt64Atomics',)),
    5055: ('ShaderClockKHR', ('e:VK_KHR_shader_clock',)),
    5249: ('SampleMaskOverrideCoverageNV', ('e:VK_NV_sample_mask_override_coverage',)),
    5251: ('GeometryShaderPassthroughNV', ('e:VK_NV_geometry_shader_passthrough',)),
    5254: ('ShaderViewportIndexLayerEXT', ('e:VK_EXT_shader_viewport_index_layer', 'e:VK_NV_viewport_array2')),
    5255: ('ShaderViewportMaskNV', ('e:VK_NV_viewport_array2',)),
    5260: ('PerViewAttributesNV', ('e:VK_NVX_multiview_per_view_attributes',)),
    5265: ('FragmentFullyCoveredEXT', ('e:VK_EXT_conservative_rasterization',)),
    5266: ('MeshShadingNV', ('e:VK_NV_mesh_shader',)),
    5282: ('ImageFootprintNV', ('f:imageFootprint',)),
    5283: ('MeshShadingEXT', ('e:VK_EXT_mesh_shader',)),
    5284: ('FragmentBarycentricKHR', ('f:fragmentShaderBarycentric',)),
    5288: ('ComputeDerivativeGroupQuadsNV', ('f:computeDerivativeGroupQuads',)),
    5291: ('FragmentDensityEXT', ('f:fragmentDensityMap', 'f:shadingRateImage')),
    5297: ('GroupNonUniformPartitionedNV', ('s:PARTITIONED_NV&e:VK_NV_shader_subgroup_partitioned',)),
    5301: ('ShaderNonUniform', ('1.2', 'e:VK_EXT_descriptor_indexing')),
    5302: ('RuntimeDescriptorArray', ('f:runtimeDescriptorArray',)),
    5303: ('InputAttachmentArrayDynamicIndexing', ('f:shaderInputAttachmentArrayDynamicIndexing',)),
    5304: ('UniformTexelBufferArrayDynamicIndexing', ('f:shaderUniformTexelBufferArrayDynamicIndexing',)),
    5305: ('StorageTexelBufferArrayDynamicIndexing', ('f:shaderStorageTexelBufferArrayDynamicIndexing',)),
    5306: ('UniformBufferArrayNonUniformIndexing', ('f:shaderUniformBufferArrayNonUniformIndexing',)),
    5307: ('SampledImageArrayNonUniformIndexing', ('f:shaderSampledImageArrayNonUniformIndexing',)),
    5308: ('StorageBufferArrayNonUniformIndexing', ('f:shaderStorageBufferArrayNonUniformIndexing',)),
    5309: ('StorageImageArrayNonUniformIndexing', ('f:shaderStorageImageArrayNonUniformIndexing',)),
    5310: ('InputAttachmentArrayNonUniformIndexing', ('f:shaderInputAttachmentArrayNonUniformIndexing',)),
    5311: ('UniformTexelBufferArrayNonUniformIndexing', ('f:shaderUniformTexelBufferArrayNonUniformIndexing',)),
    5312: ('StorageTexelBufferArrayNonUniformIndexing', ('f:shaderStorageTexelBufferArrayNonUniformIndexing',)),
    5340: ('RayTracingNV', ('e:VK_NV_ray_tracing',)),
    5341: ('RayTracingMotionBlurNV', ('f:rayTracingMotionBlur',)),
    5345: ('VulkanMemoryModel', ('f:vulkanMemoryModel',)),
    5346: ('VulkanMemoryModelDeviceScope', ('f:vulkanMemoryModelDeviceScope',)),
    5347: ('PhysicalStorageBufferAddresses', ('f:bufferDeviceAddress',)),
    5350: ('ComputeDerivativeGroupLinearNV', ('f:computeDerivativeGroupLinear',)),
    5357: ('CooperativeMatrixNV', ('f:cooperativeMatrix',)),
    5363: ('FragmentShaderSampleInterlockEXT', ('f:fragmentShaderSampleInterlock',)),
    5372: ('FragmentShaderShadingRateInterlockEXT', ('f:fragmentShaderShadingRateInterlock', 'f:shadingRateImage')),
    5373: ('ShaderSMBuiltinsNV', ('f:shaderSMBuiltins',)),
    5378: ('FragmentShaderPixelInterlockEXT', ('f:fragmentShaderPixelInterlock',)),
    5379: ('DemoteToHelperInvocationEXT', ('f:shaderDemoteToHelperInvocation',)),
    5381: ('RayTracingOpacityMicromapEXT', ('e:VK_EXT_opacity_micromap',)),
    5383: ('ShaderInvocationReorderNV', ('e:VK_NV_ray_tracing_invocation_reorder',)),
    5584: ('IntegerFunctions2INTEL', ('f:shaderIntegerFunctions2',)),
    5612: ('AtomicFloat32MinMaxEXT', ('f:shaderBufferFloat32AtomicMinMax', 'f:shaderSharedFloat32AtomicMinMax',
                                      'f:shaderImageFloat32AtomicMinMax')),
    5613: ('AtomicFloat64MinMaxEXT', ('f:shaderBufferFloat64AtomicMinMax', 'f:shaderSharedFloat64AtomicMinMax')),
    5616: ('AtomicFloat16MinMaxEXT', ('f:shaderBufferFloat16AtomicMinMax', 'f:shaderSharedFloat16AtomicMinMax')),
    6016: ('DotProductInputAllKHR', ('f:shaderIntegerDotProduct',)),
    6017: ('DotProductInput4x8BitKHR', ('f:shaderIntegerDotProduct',)),
    6018: ('DotProductInput4x8BitPackedKHR', ('f:shaderIntegerDotProduct',)),
    6019: ('DotProductKHR', ('f:shaderIntegerDotProduct',)),
    6020: ('RayCullMaskKHR', ('f:rayTracingMaintenance1',)),
    6033: ('AtomicFloat32AddEXT',
           ('f:shaderBufferFloat32AtomicAdd', 'f:shaderSharedFloat32AtomicAdd', 'f:shaderImageFloat32AtomicAdd')),
    6034: ('AtomicFloat64AddEXT', ('f:shaderBufferFloat64AtomicAdd', 'f:shaderSharedFloat64AtomicAdd')),
    6095: ('AtomicFloat16AddEXT', ('f:shaderBufferFloat16AtomicAdd', 'f:shaderSharedFloat16AtomicAdd')),
}
#: SPIR-V extension -> the alternatives that allow it
_EXTENSIONS: dict[str, tuple[str, ...]] = {
    'SPV_KHR_variable_pointers': ('1.1', 'e:VK_KHR_variable_pointers'),
    'SPV_AMD_shader_explicit_vertex_parameter': ('e:VK_AMD_shader_explicit_vertex_parameter',),
    'SPV_AMD_gcn_shader': ('e:VK_AMD_gcn_shader',),
    'SPV_AMD_gpu_shader_half_float': ('e:VK_AMD_gpu_shader_half_float',),
    'SPV_AMD_gpu_shader_int16': ('e:VK_AMD_gpu_shader_int16',),
    'SPV_AMD_shader_ballot': ('e:VK_AMD_shader_ballot',),
    'SPV_AMD_shader_fragment_mask': ('e:VK_AMD_shader_fragment_mask',),
    'SPV_AMD_shader_image_load_store_lod': ('e:VK_AMD_shader_image_load_store_lod',),
    'SPV_AMD_shader_trinary_minmax': ('e:VK_AMD_shader_trinary_minmax',),
    'SPV_AMD_texture_gather_bias_lod': ('e:VK_AMD_texture_gather_bias_lod',),
    'SPV_AMD_shader_early_and_late_fragment_tests': ('e:VK_AMD_shader_early_and_late_fragment_tests',),
    'SPV_KHR_shader_draw_parameters': ('1.1', 'e:VK_KHR_shader_draw_parameters'),
    'SPV_KHR_8bit_storage': ('1.2', 'e:VK_KHR_8bit_storage'),
    'SPV_KHR_16bit_storage': ('1.1', 'e:VK_KHR_16bit_storage'),
    'SPV_KHR_shader_clock': ('e:VK_KHR_shader_clock',),
    'SPV_KHR_float_controls': ('1.2', 'e:VK_KHR_shader_float_controls'),
    'SPV_KHR_storage_buffer_storage_class': ('1.1', 'e:VK_KHR_storage_buffer_storage_class'),
    'SPV_KHR_post_depth_coverage': ('e:VK_EXT_post_depth_coverage',),
    'SPV_EXT_shader_stencil_export': ('e:VK_EXT_shader_stencil_export',),
    'SPV_KHR_shader_ballot': ('e:VK_EXT_shader_subgroup_ballot',),
    'SPV_KHR_subgroup_vote': ('e:VK_EXT_shader_subgroup_vote',),
    'SPV_NV_sample_mask_override_coverage': ('e:VK_NV_sample_mask_override_coverage',),
    'SPV_NV_geometry_shader_passthrough': ('e:VK_NV_geometry_shader_passthrough',),
    'SPV_NV_mesh_shader': ('e:VK_NV_mesh_shader',),
    'SPV_NV_viewport_array2': ('e:VK_NV_viewport_array2',),
    'SPV_NV_shader_subgroup_partitioned': ('e:VK_NV_shader_subgroup_partitioned',),
    'SPV_NV_shader_invocation_reorder': ('e:VK_NV_ray_tracing_invocation_reorder',),
    'SPV_EXT_shader_viewport_index_layer': ('1.2', 'e:VK_EXT_shader_viewport_index_layer'),
    'SPV_NVX_multiview_per_view_attributes': ('e:VK_NVX_multiview_per_view_attributes',),
    'SPV_EXT_descriptor_indexing': ('1.2', 'e:VK_EXT_descriptor_indexing'),
    'SPV_KHR_vulkan_memory_model': ('1.2', 'e:VK_KHR_vulkan_memory_model'),
    'SPV_NV_compute_shader_derivatives': ('e:VK_NV_compute_shader_derivatives',),
    'SPV_NV_fragment_shader_barycentric': ('e:VK_NV_fragment_shader_barycentric',),
    'SPV_NV_shader_image_footprint': ('e:VK_NV_shader_image_footprint',),
    'SPV_NV_shading_rate': ('e:VK_NV_shading_rate_image',),
    'SPV_NV_ray_tracing': ('e:VK_NV_ray_tracing',),
    'SPV_KHR_ray_tracing': ('e:VK_KHR_ray_tracing_pipeline',),
    'SPV_KHR_ray_query': ('e:VK_KHR_ray_query',),
    'SPV_KHR_ray_cull_mask': ('e:VK_KHR_ray_tracing_maintenance1',),
    'SPV_GOOGLE_hlsl_functionality1': ('e:VK_GOOGLE_hlsl_functionality1',),
    'SPV_GOOGLE_user_type': ('e:VK_GOOGLE_user_type',),
    'SPV_GOOGLE_decorate_string': ('e:VK_GOOGLE_decorate_string',),
    'SPV_EXT_fragment_invocation_density': ('e:VK_EXT_fragment_density_map',),
    'SPV_KHR_physical_storage_buffer': ('1.2', 'e:VK_KHR_buffer_device_address'),
    'SPV_EXT_physical_storage_buffer': ('e:VK_EXT_buffer_device_address',),
    'SPV_NV_cooperative_matrix': ('e:VK_NV_cooperative_matrix',),
    'SPV_NV_shader_sm_builtins': ('e:VK_NV_shader_sm_builtins',),
    'SPV_EXT_fragment_shader_interlock': ('e:VK_EXT_fragment_shader_interlock',),
    'SPV_EXT_demote_to_helper_invocation': ('1.3', 'e:VK_EXT_shader_demote_to_helper_invocation'),
    'SPV_KHR_fragment_shading_rate': ('e:VK_KHR_fragment_shading_rate',),
    'SPV_KHR_non_semantic_info': ('1.3', 'e:VK_KHR_shader_non_semantic_info'),
    'SPV_EXT_shader_image_int64': ('e:VK_EXT_shader_image_atomic_int64',),
    'SPV_KHR_terminate_invocation': ('1.3', 'e:VK_KHR_shader_terminate_invocation'),
    'SPV_KHR_multiview': ('1.1', 'e:VK_KHR_multiview'),
    'SPV_KHR_workgroup_memory_explicit_layout': ('e:VK_KHR_workgroup_memory_explicit_layout',),
    'SPV_EXT_shader_atomic_float_add': ('e:VK_EXT_shader_atomic_float',),
    'SPV_KHR_fragment_shader_barycentric': ('e:VK_KHR_fragment_shader_barycentric',),
    'SPV_KHR_subgroup_uniform_control_flow': ('1.3', 'e:VK_KHR_shader_subgroup_uniform_control_flow'),
    'SPV_EXT_shader_atomic_float_min_max': ('e:VK_EXT_shader_atomic_float2',),
    'SPV_EXT_shader_atomic_float16_add': ('e:VK_EXT_shader_atomic_float2',),
    'SPV_KHR_integer_dot_product': ('1.3', 'e:VK_KHR_shader_integer_dot_product'),
    'SPV_INTEL_shader_integer_functions': ('e:VK_INTEL_shader_integer_functions2',),
    'SPV_KHR_device_group': ('1.1', 'e:VK_KHR_device_group'),
    'SPV_QCOM_image_processing': ('e:VK_QCOM_image_processing',),
    'SPV_EXT_mesh_shader': ('e:VK_EXT_mesh_shader',),
}


class DeclaredShader(Protocol):
    """What a module declares (a reflected SpirvModule of vkmulti.kernels.engine.spirv)."""

    @property
    def capabilities(self) -> frozenset[int]: ...   # OpCapability operands
    @property
    def extensions(self) -> frozenset[str]: ...     # OpExtension names
    @property
    def local_size_id(self) -> frozenset[str]: ...  # entry points sized by LocalSizeId


@dataclass(frozen=True)
class ShaderSupport:
    """What modules one device takes: its core version, the features and extensions its
    VkDevice enabled (features None: not known), the subgroup operations its compute
    shaders support and the float-controls properties it reports true."""
    device: str
    index: int
    api: tuple[int, int]
    features: frozenset[str] | None
    extensions: frozenset[str]
    subgroup_ops: frozenset[str] = frozenset()
    float_controls: frozenset[str] = frozenset()

    @classmethod
    def of_slot(cls, slot: Any) -> "ShaderSupport":
        """The support of the device of `slot` (a DeviceSlot with a live device)."""
        pd = slot.physical_device
        props = vk.vkGetPhysicalDeviceProperties(pd)
        api = int(props.apiVersion)
        version = ((api >> 22) & 0x7F, (api >> 12) & 0x3FF)
        extensions = frozenset(getattr(slot, "enabled_extensions", ()) or ())
        subgroup: frozenset[str] = frozenset()
        floats: frozenset[str] = frozenset()
        if version >= (1, 1):
            sub = _ffi.new("VkPhysicalDeviceSubgroupProperties*")
            sub.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES
            chain = sub
            fc = None
            if version >= (1, 2) or "VK_KHR_shader_float_controls" in extensions:
                fc = _ffi.new("VkPhysicalDeviceFloatControlsProperties*")
                fc.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES
                fc.pNext = sub
                chain = fc
            props2 = _ffi.new("VkPhysicalDeviceProperties2*")
            props2.sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2
            props2.pNext = chain
            vk.vkGetPhysicalDeviceProperties2(pd, props2)
            if sub.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT:
                subgroup = frozenset(n for n, bit in _SUBGROUP_BITS.items() if sub.supportedOperations & bit)
            if fc is not None:
                floats = frozenset(f"{p}Float{w}" for p in _FLOAT_CONTROLS for w in (16, 32, 64)
                                   if getattr(fc, f"{p}Float{w}"))
        features = getattr(slot, "enabled_features", None)
        return cls(str(getattr(slot, "name", "") or "?"), int(getattr(slot, "index", 0)), version,
                   None if features is None else frozenset(features), extensions, subgroup, floats)

    def allows(self, alternative: str) -> bool:
        """Whether one alternative of the tables holds on this device."""
        return all(self._holds(atom) for atom in alternative.split("&"))

    def _holds(self, atom: str) -> bool:
        kind, _, name = atom.partition(":")
        if not name:   # a core version, "1.2"
            major, minor = atom.split(".")
            return self.api >= (int(major), int(minor))
        if kind == "f":
            return self.features is not None and name in self.features
        if kind == "e":
            return name in self.extensions
        if kind == "s":
            return name in self.subgroup_ops
        return any(p.startswith(name) for p in self.float_controls)   # "p"


def _describe(alternative: str) -> str:
    parts = []
    for atom in alternative.split("&"):
        kind, _, name = atom.partition(":")
        parts.append(f"Vulkan {atom}" if not name else {"f": f"the {name} feature", "e": f"the {name} extension",
                                                         "s": f"subgroup operations {name} in compute shaders",
                                                         "p": f"{name}Float16/32/64"}[kind])
    return " with ".join(parts)


def _refuse(support: ShaderSupport, label: str, what: str, alternatives: tuple[str, ...]) -> UnsupportedError:
    where = f"GPU {support.index} ({short_repr(support.device)}, Vulkan {support.api[0]}.{support.api[1]})"
    if not alternatives:
        return UnsupportedError(f"{label} declares {what}, which Vulkan defines no way to enable; {where} cannot "
                                f"run it", device=support.device, device_index=support.index)
    needs = " or ".join(_describe(a) for a in alternatives)
    note = ""
    if support.features is None and any(a.startswith("f:") for a in alternatives):
        note = (" (this device was handed over without primary_features, so vkmulti cannot know which features "
                "were enabled: name them in MultiDeviceManager(primary_features=...))")
    elif any(a.startswith("f:") for a in alternatives):
        note = (" (the devices vkmulti makes enable only the shaderInt64, shaderFloat64 and shaderInt16 features "
                "their GPU offers: build the module without it, or hand vkmulti an engine's device made with the "
                "feature and named in primary_features)")
    extension = next((a[2:] for a in alternatives if a.startswith("e:") and "&" not in a), None)
    return UnsupportedError(f"{label} declares {what}, which needs {needs}; {where} was not made with it{note}",
                            extension=extension, device=support.device, device_index=support.index)


def check_device_support(mod: DeclaredShader, entry_point: str, support: ShaderSupport,
                         label: str = "SPIR-V") -> None:
    """UnsupportedError unless the device of `support` takes every capability and extension
    the module declares and the execution modes `entry_point` uses (see the module
    docstring); nothing is made on the device."""
    for number in sorted(mod.capabilities):
        name, alternatives = _CAPABILITIES.get(number, (f"capability number {number}", ()))
        if not any(support.allows(a) for a in alternatives):
            raise _refuse(support, label, f"the SPIR-V capability {name}", alternatives)
    for ext in sorted(mod.extensions):
        alternatives = _EXTENSIONS.get(ext, ())
        if not any(support.allows(a) for a in alternatives):
            raise _refuse(support, label, f"the SPIR-V extension {short_repr(ext)}", alternatives)
    if entry_point in mod.local_size_id and not support.allows(f"f:{LOCAL_SIZE_ID_FEATURE}"):
        raise _refuse(support, label, f"the LocalSizeId execution mode (entry point {short_repr(entry_point)})",
                      (f"f:{LOCAL_SIZE_ID_FEATURE}",))
