from .plan import AutoshardResult, autoshard

__all__ = ['autoshard', 'AutoshardResult']
