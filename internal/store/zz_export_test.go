package store

const AllocationInsertSQLForTest = allocationInsertSQL
