set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set linetype 1 linecolor rgb '#0072b2' linewidth 2 pointtype 5
set linetype 2 linecolor rgb '#d55e00' linewidth 2 pointtype 6
set linetype 3 linecolor rgb '#009e73' linewidth 2 pointtype 7
set linetype 4 linecolor rgb '#cc79a7' linewidth 2 pointtype 8
set linetype 5 linecolor rgb '#56b4e9' linewidth 2 pointtype 9
set linetype 6 linecolor rgb '#e69f00' linewidth 2 pointtype 10
set linetype 7 linecolor rgb '#000000' linewidth 2 pointtype 11
set linetype 8 linecolor rgb '#999999' linewidth 2 pointtype 12
set linetype cycle 8
set output 'docs/results/model/crossover.png'
set title 'crossover: step time saved by locality vs batch (solid mi300x, dashed h200, dotted h100; grey: 1%)'
set xlabel 'decode batch (requests, one token each per step)'
set ylabel 'step time saved by locality (%)'
set logscale x 2
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 3 lc rgb '#999999'
$d0 << EOD
1 0
2 0.748465
4 2.56466
8 5.4463
16 8.26349
32 9.05307
64 6.82156
128 3.3068
256 1.03057
512 0.242222
1024 0.0585999
2048 0.019682
4096 0
EOD
$d1 << EOD
1 0
2 0.855383
4 2.83104
8 5.83959
16 8.68572
32 9.40704
64 7.04644
128 3.40322
256 1.05388
512 0.246063
1024 0.0591048
2048 0.01973
4096 0
EOD
$d2 << EOD
1 0
2 0.975412
4 3.10924
8 6.22695
16 9.08564
32 9.73492
64 7.2524
128 3.49091
256 1.0813
512 0.251796
1024 0.0603112
2048 0.0200844
4096 0
EOD
$d3 << EOD
1 -6.66134e-14
2 0.357854
4 1.45572
8 3.78538
16 7.24186
32 10.5256
64 11.5599
128 9.28274
256 5.23388
512 2.18102
1024 0.811594
2048 0
4096 0
EOD
$d4 << EOD
1 0
2 0.409137
4 1.61957
8 4.09392
16 7.65097
32 10.9454
64 11.9121
128 9.52132
256 5.32784
512 2.19162
1024 0.805085
2048 0
4096 0
EOD
$d5 << EOD
1 0
2 0.475382
4 1.81862
8 4.44632
16 8.09568
32 11.3871
64 12.2759
128 9.76537
256 5.49567
512 2.28208
1024 0.851697
2048 0
4096 0
EOD
$d6 << EOD
1 3.33067e-14
2 0.443383
4 1.70939
8 4.05469
16 6.68902
32 7.7483
64 6.1004
128 3.1435
256 1.10213
512 0.313499
1024 0.0952589
2048 0.0412029
4096 0
EOD
$d7 << EOD
1 1.88738e-13
2 0.520607
4 1.95226
8 4.4998
16 7.25237
32 8.2774
64 6.46975
128 3.32356
256 1.16169
512 0.328991
1024 0.0992607
2048 0.042512
4096 0
EOD
$d8 << EOD
1 5.88418e-13
2 0.650844
4 2.33311
8 5.14924
16 8.02928
32 8.98208
64 6.95345
128 3.55768
256 1.24103
512 0.350065
1024 0.104951
2048 0.0445598
4096 0
EOD
$d9 << EOD
1 0
2 0.103378
4 0.45098
8 1.30314
16 2.89384
32 5.19162
64 7.81653
128 10.1874
256 11.7943
512 12.5594
1024 12.5339
2048 11.5204
4096 9.30676
EOD
$d10 << EOD
1 0
2 0.121052
4 0.524495
8 1.49954
16 3.28195
32 5.78784
64 8.5609
128 10.9731
256 12.517
512 13.1556
1024 12.9759
2048 11.804
4096 9.45467
EOD
$d11 << EOD
1 0
2 0.154539
4 0.661078
8 1.85359
16 3.95406
32 6.77379
64 9.73602
128 12.1618
256 13.571
512 13.9978
1024 13.5831
2048 12.1843
4096 9.64904
EOD
$d12 << EOD
1 0
2 0.848374
4 2.64306
8 4.77819
16 5.56479
32 4.00791
64 1.65277
128 0.385965
256 0.0569857
512 0.00695933
1024 0.000810867
2048 0
4096 0
EOD
$d13 << EOD
1 0
2 0.949124
4 2.88894
8 5.11996
16 5.8805
32 4.19637
64 1.71658
128 0.397236
256 0.058031
512 0.00703105
1024 0.000814834
2048 0
4096 0
EOD
$d14 << EOD
1 0
2 1.13593
4 3.31613
8 5.68286
16 6.38187
32 4.48864
64 1.81354
128 0.413977
256 0.0597948
512 0.00716881
1024 0.000824975
2048 0
4096 0
EOD
$d15 << EOD
1 0
2 0.269414
4 1.15051
8 3.14207
16 6.23589
32 9.25188
64 10.2412
128 8.2083
256 4.59996
512 1.90417
1024 0.740237
2048 0.364432
4096 0.238678
EOD
$d16 << EOD
1 0
2 0.311556
4 1.29584
8 3.4379
16 6.65308
32 9.69813
64 10.627
128 8.47788
256 4.69331
512 1.92208
1024 0.733795
2048 0.351478
4096 0.222309
EOD
$d17 << EOD
1 0
2 0.384874
4 1.53143
8 3.88316
16 7.24321
32 10.3033
64 11.1379
128 8.8311
256 4.96481
512 2.06652
1024 0.809971
2048 0.403958
4096 0.269159
EOD
set key below
plot $d0 using 1:2 with linespoints lt 1 dt 1 title 'mi300x, qwen3-30b-a3b', $d1 using 1:2 with linespoints lt 1 dt 2 title 'h200, qwen3-30b-a3b', $d2 using 1:2 with linespoints lt 1 dt 3 title 'h100, qwen3-30b-a3b', $d3 using 1:2 with linespoints lt 2 dt 1 title 'mi300x, gpt-oss-120b', $d4 using 1:2 with linespoints lt 2 dt 2 title 'h200, gpt-oss-120b', $d5 using 1:2 with linespoints lt 2 dt 3 title 'h100, gpt-oss-120b', $d6 using 1:2 with linespoints lt 3 dt 1 title 'mi300x, qwen3-235b-a22b', $d7 using 1:2 with linespoints lt 3 dt 2 title 'h200, qwen3-235b-a22b', $d8 using 1:2 with linespoints lt 3 dt 3 title 'h100, qwen3-235b-a22b', $d9 using 1:2 with linespoints lt 4 dt 1 title 'mi300x, llama4-maverick', $d10 using 1:2 with linespoints lt 4 dt 2 title 'h200, llama4-maverick', $d11 using 1:2 with linespoints lt 4 dt 3 title 'h100, llama4-maverick', $d12 using 1:2 with linespoints lt 5 dt 1 title 'mi300x, olmoe-1b-7b', $d13 using 1:2 with linespoints lt 5 dt 2 title 'h200, olmoe-1b-7b', $d14 using 1:2 with linespoints lt 5 dt 3 title 'h100, olmoe-1b-7b', $d15 using 1:2 with linespoints lt 6 dt 1 title 'mi300x, deepseek-v3', $d16 using 1:2 with linespoints lt 6 dt 2 title 'h200, deepseek-v3', $d17 using 1:2 with linespoints lt 6 dt 3 title 'h100, deepseek-v3'
