"""The worker's engine: what `pgqueue.Worker` is built from.

Each queue of a worker is a lane (`lanes`): its ledger of claims
(`ledger`), claim policy (`policy`), claimer (`claimer`), consumers
(`consumers`) and fleet-wide lease (`lease`). Shared between the lanes
(`services`): the job runner (`runner`), the outcome writer (`writer`),
the heartbeats and sweeps (`upkeep`), cancel hints from the control
channel (`control`) and the periodic scheduler (`periodic`).
"""
