"""DIST: process groups, backends and launchers (nccl to hccl)."""
