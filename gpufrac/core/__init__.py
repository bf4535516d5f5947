"""The pure core both programs share: the annotation grammar, quantities, the webhook-agent contract, logging."""
