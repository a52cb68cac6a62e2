from torchvision._missing import module_getattr

__getattr__ = module_getattr("torchvision.transforms.functional")
