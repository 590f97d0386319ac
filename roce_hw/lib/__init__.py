# SPDX-License-Identifier: BSD-2-Clause
"""Generic blocks: packet streams, CRC and iCRC, header inserter and extractor, queues, helpers."""
