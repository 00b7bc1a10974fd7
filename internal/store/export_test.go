package store

// WindowSlotsSQL lets tests EXPLAIN the placement window's slot statement.
var WindowSlotsSQL = windowSlotsSQL
