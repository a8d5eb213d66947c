from django.apps import AppConfig


class ReliabilityWorkersConfig(AppConfig):
    name = "tests.reliability.workerapp"
    label = "reliability_workers"
