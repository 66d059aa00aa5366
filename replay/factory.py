"""The model factory: from a scenario's specs (replay/specs.py), the calibrated base model, the
communication model (inside the optical circuit switch model when [optical] is given) and the
compute model the engine plugs in. Only this module decides which model a scenario gets.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from .checks import ScenarioError
from .compute import ComputeModel
from .calibration import calibrate as calibrate_run
from .calibration import calibrate_nccl_tests
from .costs import DEFAULT_LINKS, LINK_CLASSES, Link
from .network import AlphaBetaModel, CalibratedModel, MeasuredComm, WhatIfComm
from .optical import OpticalModel

if TYPE_CHECKING:
    from .specs import ComputeSpec, NetworkSpec, OpticalSpec, Scenario


def calibrate(net: "NetworkSpec", colls, nccl_tests=None, *, where: str) -> CalibratedModel | None:
    """The base model per [network] calibrate: the run's collectives, the store's nccl-tests rows, or
    None. where names the scenario in messages."""
    if net.calibrate == "none":
        return None
    if net.calibrate == "run":
        return calibrate_run(colls, algorithm=net.calibrate_algorithm, gpus_per_node=net.gpus_per_node)
    if nccl_tests is None or len(nccl_tests) == 0:
        raise ScenarioError(f"{where}: [network] calibrate: 'nccl_tests' but the store has no nccl-tests rows "
                            "(ingest with --nccl-tests FILE)")
    if net.nccl_tests_group_size is None:
        raise ScenarioError(f"{where}: [network] nccl_tests_group_size: required with calibrate = 'nccl_tests' "
                            "(nccl-tests does not record its rank count)")
    return calibrate_nccl_tests(nccl_tests, group_size=net.nccl_tests_group_size, n_hosts=net.nccl_tests_hosts,
                                algorithm=net.calibrate_algorithm, gpus_per_node=net.gpus_per_node)


def comm_model(sc: "Scenario", base=None, *, nccl_tests=None, with_optical: bool = True):
    """The scenario's communication model. base: a CalibratedModel, the collectives frame (calibrated
    here when something re-costs transfers) or None."""
    if isinstance(base, pd.DataFrame):
        base = sc.calibrate(base, nccl_tests) if sc.needs_calibration else None
    model = _network_model(sc, base)
    if with_optical and sc.optical is not None:
        return optical_model(sc.optical, model)
    return model


def _network_model(sc: "Scenario", base: CalibratedModel | None):
    net = sc.network
    if net.algorithm == "measured" or not net.changes_network:
        if sc.optical is not None and sc.optical.own_circuits:
            if net.calibrate == "none":  # absolute costs from the default links
                return AlphaBetaModel(gpus_per_node=net.gpus_per_node)
            if base is None:
                raise ScenarioError(f"{sc.where}: [optical] circuits with their own bandwidth or latency need a "
                                    "calibrated model: pass the collectives or scenario.calibrate(colls)")
            return WhatIfComm(base)  # measured times, re-costable on circuits
        return MeasuredComm()
    links = net.packet_links
    bw, lat = net.bandwidth_scale, net.latency_scale
    if net.calibrate == "none":
        # no calibration: absolute costs from the default links, scaled, with the given ones as written
        full = {}
        for c in LINK_CLASSES:
            d = DEFAULT_LINKS[c]
            scaled = Link(bandwidth_gbps=d.bandwidth_gbps * bw, latency_us=d.latency_us * lat)
            full[c] = links[c].over(scaled) if c in links else scaled
        return AlphaBetaModel(links=full, algorithm=net.algorithm or "ring", gpus_per_node=net.gpus_per_node)
    if base is None:
        raise ScenarioError(f"{sc.where}: [network] changes the network but no calibrated model was given: "
                            "pass the collectives or scenario.calibrate(colls) to comm_model")
    return WhatIfComm(base, bandwidth_scale=bw, latency_scale=lat, links=links, algorithm=net.algorithm)


def optical_model(opt: "OpticalSpec", inner) -> OpticalModel:
    return OpticalModel(inner, reconfig_delay_ms=opt.reconfig_delay_ms, schedule=opt.schedule,
                        phases=list(opt.phases), circuit_bandwidth_gbps=opt.circuit_bandwidth_gbps,
                        circuit_latency_us=opt.circuit_latency_us, circuits=opt.circuits,
                        gpus_per_node=opt.gpus_per_node)


def compute_model(c: "ComputeSpec") -> ComputeModel:
    return ComputeModel(speedups=list(c.speedup), rank_slowdown=dict(c.rank_slowdown), cpu_scale=c.cpu_scale)
