from torchvision._missing import module_getattr

__getattr__ = module_getattr("torchvision")
__version__ = "0.0+sglang_ssd.placeholder"
